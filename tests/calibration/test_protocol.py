"""The validation protocol: three disjoint sets that cover every produced target, a fit
that cannot reach beyond the calibrate set, and sealed scores that are logged looks.

Fast: no simulation. Where a command is run, the sim's predictions are replaced by fixed
numbers (the bookkeeping is under test, not the sim), so no test scores the sealed set.
"""
from __future__ import annotations

import ast
import csv
import hashlib
import re
from pathlib import Path

import pytest
import yaml

from analysis import validate
from specscale.calibration import evaluate
from specscale.calibration.evaluate import Evaluator
from specscale.calibration.protocol import SETS, ProtocolError, parse, protocol, protocol_hash
from specscale.calibration.targets import (CALIBRATION, DEVELOP, SEALED, SERVING_RATES, TARGETS, Target, cell,
                                           check_fittable, metric)
from specscale.resources import validation_protocol

ROOT = Path(__file__).resolve().parents[2]
BY_SET = {"calibrate": CALIBRATION, "develop": DEVELOP, "sealed": SEALED}


def _ids(targets) -> set[str]:
    return {t.id for t in targets}


def _variant(edit) -> bytes:
    """The protocol's bytes after ``edit(raw)`` on its parsed YAML."""
    raw = yaml.safe_load(validation_protocol().read_bytes())
    edit(raw)
    return yaml.safe_dump(raw, sort_keys=False).encode()


# ---------------------------------------------------------------------- the sets
def test_the_three_sets_are_disjoint_and_cover_every_produced_target():
    ids = {name: _ids(ts) for name, ts in BY_SET.items()}
    assert sum(len(ts) for ts in BY_SET.values()) == len(TARGETS)
    assert set().union(*ids.values()) == set(TARGETS)
    for a in SETS:
        for b in SETS:
            assert a == b or not ids[a] & ids[b], (a, b)
    for name, ts in BY_SET.items():  # the protocol's order, each target's own id
        assert [t.id for t in ts] == list(protocol().ids(name))


def test_what_is_sealed_and_what_may_be_fitted():
    sealed, cal = _ids(SEALED), _ids(CALIBRATION)
    for den in ("spec", "fasttts", "nonspec"):  # the headline ratios ...
        assert f"fig13_ratio/qwen2.5-7b/b8/full_vs_{den}/throughput_ratio" in sealed
    for pol in ("spec", "fasttts", "full"):  # ... and the absolutes they are derived from
        assert f"fig13/qwen2.5-7b/b8/{pol}/output_tok_s" in sealed
    # Each model pair's workload is fitted on its nonspec numbers only.
    assert {t.id for t in CALIBRATION if t.id.startswith("fig13/")} == {
        "fig13/qwen2.5-7b/b4/nonspec/output_tok_s", "fig13/qwen2.5-7b/b8/nonspec/output_tok_s",
        "fig13/qwen2.5-3b/b8/nonspec/output_tok_s"}
    assert not any("_ratio/" in i or "/full" in i or "/ep" in i for i in cal)


def test_protocol_hash_is_the_files_sha256():
    assert protocol_hash() == hashlib.sha256(validation_protocol().read_bytes()).hexdigest()[:12]
    assert protocol().version >= 1 and protocol().n_problems == 500 and protocol().seeds == (0, 1, 2)


def test_every_target_cell_carries_the_protocols_readings():
    assert SERVING_RATES == protocol().serving_rates
    for t in TARGETS.values():
        for c in t.cells:
            assert set(protocol().trigger_overrides) <= set(c.overrides), c.name


@pytest.mark.parametrize("edit,match", [
    (lambda raw: raw["sets"]["develop"]["ids"].append(raw["sets"]["sealed"]["ids"][0]), "in two sets"),
    (lambda raw: raw["sets"]["sealed"]["ids"].append(raw["sets"]["sealed"]["ids"][0]), "listed twice"),
    (lambda raw: raw["sets"].pop("develop"), "sets must be exactly"),
    (lambda raw: raw.update(version=0), "version"),
    (lambda raw: raw.update(seeds=[0, 0]), "seeds"),
    (lambda raw: raw["metric"].update(throughput="tok_s"), "metric.throughput"),
])
def test_a_malformed_protocol_is_refused(edit, match):
    with pytest.raises(ProtocolError, match=match):
        parse(_variant(edit))


def test_an_unknown_or_unlisted_id_is_refused():
    unknown = parse(_variant(lambda raw: raw["sets"]["develop"]["ids"].append("fig99/nothing/b1/x/y")))
    with pytest.raises(ProtocolError, match="unknown target id.*fig99"):
        unknown.check_covers(TARGETS)
    dropped = parse(_variant(lambda raw: raw["sets"]["sealed"]["ids"].pop()))
    with pytest.raises(ProtocolError, match="in no set"):
        dropped.check_covers(TARGETS)


# ---------------------------------------------------------------------- calibration reads no other set
FORBIDDEN_NAMES = {"SEALED", "DEVELOP", "VALIDATION", "TARGETS", "produced", "select"}
FORBIDDEN_STRINGS = {"sealed", "develop"}


@pytest.mark.parametrize("module", ["specscale/calibration/__main__.py", "specscale/calibration/fit.py"])
def test_calibration_never_references_the_held_out_sets(module):
    tree = ast.parse((ROOT / module).read_text())
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.alias):
            names += [node.name, node.asname or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            assert node.value.strip().lower() not in FORBIDDEN_STRINGS, (module, node.value)
        assert not FORBIDDEN_NAMES & set(names), (module, names)


def test_the_calibration_entry_point_refuses_a_target_outside_the_calibrate_set(monkeypatch):
    import importlib

    cal_main = importlib.import_module("specscale.calibration.__main__")
    assert cal_main.fitted_targets() == CALIBRATION
    for other in (DEVELOP[0], SEALED[0]):
        monkeypatch.setattr(cal_main, "CALIBRATION", (*CALIBRATION, other))
        with pytest.raises(ProtocolError, match=re.escape(other.id)):
            cal_main.fitted_targets()
    with pytest.raises(ProtocolError, match="no set"):
        check_fittable([Target("made up", (), lambda s: 0.0, 1.0, id="made/up")])


# ---------------------------------------------------------------------- seeds
def _fake_cell(overrides, measure_overlap=False):
    """A summary whose throughput is 100 + 10 * seed: the mean over seeds is checkable."""
    seed = int(next(o for o in overrides if o.startswith("seed=")).split("=")[1])
    return {"output_tok_s": 100.0 + 10.0 * seed, "makespan_s": 1.0 + seed}


def test_a_prediction_is_the_mean_over_seeds(monkeypatch):
    monkeypatch.setattr(evaluate, "run_cell_summary", _fake_cell)
    c = cell("nonspec", 4)
    t = Target("tok/s", (c,), metric(c, "output_tok_s"), 100.0, beside=metric(c, "makespan_s"))
    with Evaluator(n_problems=2, seeds=(0, 1, 2), jobs=1) as ev:
        assert ev.predict([t]) == [pytest.approx(110.0)]
        assert ev.beside([t]) == [pytest.approx(2.0)]
        assert ev.runs == 3  # each seed once, cached for the second call
        with pytest.raises(ValueError, match="which seed"):
            ev.summaries([c])
        assert ev.summaries([c], seed=2)[c.name]["output_tok_s"] == 120.0
    with Evaluator(n_problems=2, seeds=(2,), jobs=1) as one:  # the single-seed path: one run per cell
        assert one.predict([t]) == [pytest.approx(120.0)] and one.runs == 1
        assert one.summaries([c])[c.name]["output_tok_s"] == 120.0


# ---------------------------------------------------------------------- looks
def _fixed_predictions(monkeypatch, value=lambda t: t.value):
    """The sim replaced: every target predicted at ``value(t)`` (the paper's number by default)."""
    calls = []

    def predict(self, targets, overrides=()):
        calls.append(len(targets))
        return [float(value(t)) for t in targets]

    monkeypatch.setattr(Evaluator, "predict", predict)
    monkeypatch.setattr(Evaluator, "beside", lambda self, targets, overrides=(): [float("nan")] * len(targets))
    return calls


def _looks(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_sealed_appends_exactly_one_look(monkeypatch, tmp_path, capsys):
    calls = _fixed_predictions(monkeypatch)
    looks = tmp_path / "looks.csv"
    looks.write_bytes((ROOT / "results" / "validation" / "looks.csv").read_bytes())  # the committed record
    before = _looks(looks)
    argv = ["--sealed", "--looks", str(looks), "--results-dir", str(tmp_path), "--jobs", "1"]
    assert validate.main(argv) == 0
    after = _looks(looks)
    assert after[:-1] == before and len(after) == len(before) + 1 and calls == [len(SEALED)]
    row = after[-1]
    assert tuple(row) == validate.LOOKS_COLUMNS
    assert row["set"] == "sealed" and row["protocol_version"] == str(protocol().version)
    assert row["protocol_hash"] == protocol_hash() and row["n_targets"] == str(len(SEALED))
    numeric = [t for t in SEALED if t.numeric]
    assert (row["numeric_within"], row["numeric_total"]) == (str(len(numeric)), str(len(numeric)))
    assert float(row["score"]) == 1.0 and row["orderings_total"] == str(len(SEALED) - len(numeric))
    n_v1 = sum(r["set"] == "sealed" and r["protocol_version"] == str(protocol().version) for r in after)
    assert f"sealed looks under protocol v1: {n_v1}" in capsys.readouterr().out  # the committed ones and this
    assert (tmp_path / "validation" / "sealed.csv").is_file() and (tmp_path / "validation" / "sealed.md").is_file()
    assert not (tmp_path / "validation" / "validation.csv").exists()  # the develop table is another run's

    sec = validate.build_section(tmp_path, tmp_path / "report", looks=looks)
    assert any(caption.startswith("Sealed targets") for caption, *_ in sec.tables)
    assert f"sealed looks under protocol v1: {n_v1}." in sec.notes


def test_a_new_looks_file_gets_its_header_and_a_non_protocol_run_says_so(monkeypatch, tmp_path, capsys):
    _fixed_predictions(monkeypatch, lambda t: t.value * 2)
    looks = tmp_path / "sub" / "looks.csv"
    argv = ["--sealed", "--looks", str(looks), "--results-dir", str(tmp_path), "--n-problems", "4", "--seeds", "0"]
    assert validate.main(argv) == 0
    (row,) = _looks(looks)
    assert "not a protocol score" in row["note"] and row["numeric_within"] == "0"
    assert "WARNING" in capsys.readouterr().out


def test_a_changed_protocol_under_a_looked_at_version_is_refused(monkeypatch, tmp_path, capsys):
    calls = _fixed_predictions(monkeypatch)
    looks = tmp_path / "looks.csv"
    with open(looks, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=validate.LOOKS_COLUMNS)
        w.writeheader()
        w.writerow({"date": "2026-12-05", "protocol_version": str(protocol().version), "protocol_hash": "0" * 12,
                    "set": "sealed", "note": "under an earlier file"})
    text = looks.read_text()
    assert validate.main(["--sealed", "--looks", str(looks), "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "bump `version`" in err and len(err.strip().splitlines()) == 1
    assert looks.read_text() == text and calls == []  # nothing scored, nothing appended
    assert not (tmp_path / "validation").exists()


def test_the_develop_run_logs_no_look(monkeypatch, tmp_path):
    calls = _fixed_predictions(monkeypatch)
    looks = tmp_path / "looks.csv"
    assert validate.main(["--looks", str(looks), "--results-dir", str(tmp_path), "--jobs", "1"]) == 0
    assert calls == [len(DEVELOP)] and not looks.exists()
    assert (tmp_path / "validation" / "validation.csv").is_file()
