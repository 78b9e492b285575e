"""Fixtures for the analysis tests: a tiny simulated sweep in which every figure family
gets its cells, and helpers to run single cells and write an index.

Cells run directly through `run_cell` with the small test config (well under a second
each); W&B logging, where the harness has it, is switched off so nothing but result
files is written.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from cfg_helpers import compose_cfg
from specscale.cell import run_cell

ABLATION = ("nonspec", "spec", "ep", "ep_strict", "ep_cd", "full", "fasttts")


def run_small_cell(out: Path, *overrides: str) -> dict:
    cfg = compose_cfg(*overrides)
    cfg["wandb"] = {"mode": "disabled"}  # ignored by harness versions without W&B
    return run_cell(cfg, out)


def sweep_specs() -> list[tuple[str, tuple[str, ...]]]:
    """(relative cell dir, overrides) for 27 cells."""
    specs = []
    for pol in ABLATION:
        for beam in (4, 8):
            specs.append((f"ablation/{pol}/b{beam}-c4-s1", (f"policy={pol}", f"beam={beam}", "seed=1")))
    for b_max in (256, 4096):  # Fig. 16: full over the LV threshold, beside 2048 above
        specs.append((f"lv/full/b4-bmax{b_max}", ("policy=full", "beam=4", "seed=1", f"policy.b_max={b_max}")))
    for seed in (1, 2):  # adaptive verification beside full at three B_max and ep_cd
        specs.append((f"adaptive/b4-s{seed}", ("policy=adaptive", "beam=4", f"seed={seed}")))
    for pol in ("nonspec", "full", "ep_strict"):  # a second seed: t-intervals, paired tests
        specs.append((f"seeds/{pol}/b4-c4-s2", (f"policy={pol}", "beam=4", "seed=2")))
    for pol in ("nonspec", "full"):
        for rate in (2.0, 8.0):  # serving curves
            specs.append((f"serving/{pol}/b4-r{rate}", (f"policy={pol}", "beam=4", "seed=1", "workload=poisson",
                                                        f"workload.rate={rate}")))
        specs.append((f"concurrency/{pol}/b4-c2", (f"policy={pol}", "beam=4", "seed=1", "concurrency=2")))
    return specs


@contextmanager
def one_torch_thread():
    """The sim sampler runs torch ops on tiny tensors; on a busy 2-core machine the
    intra-op thread pool makes each cell ~20x slower than one thread. Restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def build_sweep(root: Path) -> Path:
    root = Path(root)
    with one_torch_thread():
        for rel, overrides in sweep_specs():
            run_small_cell(root / rel, *overrides)
    write_index(root / "serving")  # one subtree read through an index, the rest scanned
    write_validation(root)
    write_sensitivity(root)
    write_fidelity(root)
    write_search_family(root)
    failed = root / "ablation" / "spec" / "b16-c4-s1"  # a failed cell the report must list
    failed.mkdir(parents=True)
    (failed / "error.json").write_text(json.dumps({"status": "failed", "error_type": "RuntimeError",
                                                   "error": "KV leak: 3 blocks", "experiment": "ablation"}))
    (failed / "config.json").write_text(json.dumps({"policy": {"name": "spec"}, "beam": 16, "seed": 1,
                                                    "concurrency": 4, "workload": {"kind": "saturated"}}))
    return root


def write_validation(root: Path) -> None:
    """A real (tiny) validation run of two develop targets, as analysis.validate writes it
    (never sealed ones: a test must not score the sealed set)."""
    from analysis import validate
    from specscale.calibration.evaluate import Evaluator
    from specscale.calibration.targets import TARGETS

    subset = [TARGETS[i] for i in ("fig13/qwen2.5-7b/b8/ep/output_tok_s", "fig13/qwen2.5-7b/b8/ep_cd/output_tok_s")]
    with one_torch_thread(), Evaluator(n_problems=4, jobs=1) as ev:
        predicted, beside = ev.predict(subset), ev.beside(subset)
    validate.write(validate.validation_table(subset, predicted, beside),
                   {"set": "develop", "profile": "sim", "n_problems": 4, "seeds": [0]}, root / validate.SUBDIR)


def write_sensitivity(root: Path) -> None:
    """A real (tiny) engine-efficiency study, as analysis.sensitivity writes it."""
    from analysis import sensitivity as S
    from analysis.output import save_table
    from specscale.calibration.evaluate import Evaluator

    with one_torch_thread(), Evaluator(n_problems=2, jobs=1, base=("engine=sim",)) as cal, \
            Evaluator(n_problems=2, jobs=1, base=("engine=sim_roofline",)) as roof:
        df = S.overhead({"sim": cal, "sim_roofline": roof}, beam=4, scales=(0.0, 1.0))
    save_table(df, root / S.SUBDIR, "overhead")


def write_fidelity(root: Path) -> None:
    """A real (one-cell) fidelity run on a profile fitted from a known cost function."""
    import yaml

    from analysis import fidelity
    from cost_profiles import analytic_profile

    prof = root / "profile.yaml"
    prof.write_text(yaml.safe_dump({"name": "profiled:test", "memory_gb": 80, "hbm_bandwidth_tb_s": 2.0,
                                    "bf16_tflops": 300, "profile": analytic_profile().as_dict()}))
    with one_torch_thread():
        fidelity.main(["--profile", str(prof), "--policies", "nonspec", "--beams", "4", "--concurrency", "2",
                       "--workloads", "saturated", "--reps", "1", "--n-problems", "2", "--results-dir", str(root)])


def write_search_family(root: Path) -> None:
    """Real (tiny) cells of +experiment=search_family: one search, two policies, measured and predicted."""
    from specscale.cell_job import run_and_store
    from specscale.compose import compose_config

    with one_torch_thread():
        for engine in ("torch", "sim"):
            for policy in ("nonspec", "ep"):
                run_and_store(compose_config(["+experiment=search_family", f"engine={engine}", f"policy={policy}",
                                              "beam=4", "n_problems=3", "concurrency=3", "search.max_rounds=8",
                                              "hardware=profiled/cpu-tiny", f"results_dir={root}", "wandb.mode=disabled",
                                              *(["engine.probe_check=false"] if engine == "sim" else [])]))  # fmt: skip


def write_index(root: Path) -> pd.DataFrame:
    """An index.parquet as the results store writes it (nested values as JSON text,
    cell_dir relative to the index), written here so the tests need no store code."""
    rows = []
    for summary in sorted(Path(root).rglob("summary.json")):
        data = json.loads(summary.read_text())
        row = {k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for k, v in data.items()}
        row.update(status="ok", cell_dir=str(summary.parent.relative_to(root)), experiment=Path(root).name)
        rows.append(row)
    df = pd.DataFrame(rows)
    df.to_parquet(Path(root) / "index.parquet", index=False)
    return df


@pytest.fixture(scope="session")
def sweep_dir(tmp_path_factory) -> Path:
    return build_sweep(tmp_path_factory.mktemp("sweep"))


@pytest.fixture(scope="session")
def small_cell():
    """run_small_cell(out_dir, *overrides) -> summary (single torch thread, see above)."""
    def run(out: Path, *overrides: str) -> dict:
        with one_torch_thread():
            return run_small_cell(out, *overrides)

    return run


@pytest.fixture(scope="session")
def index_writer():
    """write_index(root) -> the index frame written to root/index.parquet."""
    return write_index


@pytest.fixture(scope="session")
def sweep_report(sweep_dir, tmp_path_factory):
    """(report.md, out dir) of the sweep, rendered once for every test that reads it."""
    from analysis.report import make_report

    out = tmp_path_factory.mktemp("report")
    return make_report(sweep_dir, out), out
