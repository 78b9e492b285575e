"""The validation protocol (results/validation/protocol.yaml): read once, checked, hashed.

The protocol fixes, before the numbers that score the sim are looked at, how it is
scored: the throughput and latency readings, lazy verification's trigger semantics, the
arrivals, ``n_problems``, the seeds, and three disjoint sets of target ids:

* ``calibrate``: the only targets a fit may use;
* ``develop``: targets that may be looked at while building mechanisms;
* ``sealed``: the paper's claims, scored only by ``python -m analysis.validate --sealed``
  (each score appended to results/validation/looks.csv).

This module knows ids, not targets (``targets`` selects its targets by these ids and
calls ``check_covers`` with the ids it produced), so the protocol can be read without
building a single target. Every malformed protocol is a ``ProtocolError`` that names
the key at fault.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

SETS = ("calibrate", "develop", "sealed")
# The summary readings the protocol may name (specscale.metrics.summary writes them).
THROUGHPUT_READINGS = ("output_tok_s", "logical_tok_s")
LATENCY_READINGS = ("norm_latency_ms_per_output_tok", "norm_latency_ms_per_tok")


class ProtocolError(ValueError):
    """The protocol file is malformed, or disagrees with the targets the code produces."""


@dataclass(frozen=True)
class Protocol:
    version: int
    hash: str  # first 12 hex digits of the file's sha256
    path: Path
    throughput_key: str  # the summary field every output tok/s target reads
    latency_key: str  # the normalised latency the beam-32 targets read
    trigger_semantics: tuple[tuple[str, str], ...]  # (override key, value), pinned on every target cell
    throughput_workload: str  # arrivals of the throughput targets (saturated)
    serving_workload: str  # arrivals of the serving knees (poisson)
    serving_rates: tuple[float, ...]
    n_problems: int
    seeds: tuple[int, ...]
    sets: tuple[tuple[str, tuple[str, ...]], ...]  # (set name, ids) in SETS order
    reasons: tuple[tuple[str, str], ...]

    @property
    def trigger_overrides(self) -> tuple[str, ...]:
        return tuple(f"{k}={v}" for k, v in self.trigger_semantics)

    def ids(self, name: str) -> tuple[str, ...]:
        if name not in SETS:
            raise ProtocolError(f"unknown set {name!r}: the protocol's sets are {', '.join(SETS)}")
        return dict(self.sets)[name]

    def set_of(self, target_id: str) -> str:
        for name, ids in self.sets:
            if target_id in ids:
                return name
        raise ProtocolError(f"target id {target_id!r} is in no set of {self.path}")

    def _where(self, target_id: str) -> str:
        return next((name for name, ids in self.sets if target_id in ids), "in no set")

    def check_covers(self, produced: Iterable[str]) -> None:
        """Every listed id names a produced target, and every produced target is listed."""
        produced = set(produced)
        listed = {i for _, ids in self.sets for i in ids}
        unknown = sorted(listed - produced)
        if unknown:
            raise ProtocolError(f"{self.path}: unknown target id(s) {unknown} (not produced by "
                                "specscale/calibration/targets.py)")
        unlisted = sorted(produced - listed)
        if unlisted:
            raise ProtocolError(f"{self.path}: produced target(s) {unlisted} are in no set: list each under "
                                f"one of {', '.join(SETS)}")

    def check_fittable(self, target_ids: Iterable[str]) -> None:
        """Raise unless every id is in the calibrate set (a fit may use nothing else)."""
        allowed = set(self.ids("calibrate"))
        bad = [i for i in target_ids if i not in allowed]
        if bad:
            raise ProtocolError("a fit may use only the protocol's calibrate set; refused: "
                                + ", ".join(f"{i or '<no id>'} ({self._where(i)})" for i in bad))


def hash_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def _need(node: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(node, Mapping) or key not in node:
        raise ProtocolError(f"protocol: missing {where}{key}")
    return node[key]


def _choice(value: Any, allowed: tuple[str, ...], where: str) -> str:
    if value not in allowed:
        raise ProtocolError(f"protocol: {where} is {value!r}; the sim reads one of {', '.join(allowed)}")
    return str(value)


def _sets(node: Any) -> tuple[tuple[tuple[str, tuple[str, ...]], ...], tuple[tuple[str, str], ...]]:
    """The three id lists: each id a non-empty string, listed once, in exactly one set."""
    if not isinstance(node, Mapping) or set(node) != set(SETS):
        got = sorted(node) if isinstance(node, Mapping) else node
        raise ProtocolError(f"protocol: sets must be exactly {', '.join(SETS)}; got {got}")
    seen: dict[str, str] = {}
    sets, reasons = [], []
    for name in SETS:
        ids = _need(node[name], "ids", f"sets.{name}.")
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ProtocolError(f"protocol: sets.{name}.ids must be a list of non-empty strings")
        for i in ids:
            if i in seen:
                where = "twice in" if seen[i] == name else f"in two sets: {seen[i]} and"
                raise ProtocolError(f"protocol: target id {i!r} is listed {where} {name}")
            seen[i] = name
        sets.append((name, tuple(ids)))
        reasons.append((name, str(node[name].get("reason", "")).strip()))
    return tuple(sets), tuple(reasons)


def parse(data: bytes, path: Path = Path("<protocol>")) -> Protocol:
    raw = yaml.safe_load(data)
    if not isinstance(raw, Mapping):
        raise ProtocolError(f"{path}: not a YAML mapping")
    version = _need(raw, "version", "")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ProtocolError(f"protocol: version must be a positive integer; got {version!r}")
    metric, latency, arrivals = _need(raw, "metric", ""), _need(raw, "latency", ""), _need(raw, "arrivals", "")
    knees = _need(arrivals, "serving_knees", "arrivals.")
    rates = _need(knees, "rates", "arrivals.serving_knees.")
    if not isinstance(rates, list) or not rates or not all(isinstance(r, (int, float)) and r > 0 for r in rates):
        raise ProtocolError("protocol: arrivals.serving_knees.rates must be a list of positive numbers")
    seeds = _need(raw, "seeds", "")
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ProtocolError(f"protocol: seeds must be a non-empty list of distinct integers; got {seeds!r}")
    n = _need(raw, "n_problems", "")
    if not isinstance(n, int) or n < 1:
        raise ProtocolError(f"protocol: n_problems must be a positive integer; got {n!r}")
    triggers = _need(raw, "trigger_semantics", "")
    if not isinstance(triggers, Mapping) or not all(str(k).startswith("policy.") for k in triggers):
        raise ProtocolError("protocol: trigger_semantics must map policy.<key> to a value")
    sets, reasons = _sets(_need(raw, "sets", ""))
    return Protocol(
        version=version, hash=hash_bytes(data), path=Path(path),
        throughput_key=_choice(_need(metric, "throughput", "metric."), THROUGHPUT_READINGS, "metric.throughput"),
        latency_key=_choice(_need(latency, "key", "latency."), LATENCY_READINGS, "latency.key"),
        trigger_semantics=tuple((str(k), str(v)) for k, v in triggers.items()),
        throughput_workload=str(_need(arrivals, "throughput", "arrivals.")),
        serving_workload=str(_need(knees, "kind", "arrivals.serving_knees.")),
        serving_rates=tuple(float(r) for r in rates), n_problems=n, seeds=tuple(seeds), sets=sets, reasons=reasons)


def parse_seeds(text: str) -> tuple[int, ...]:
    """A command line's --seeds 0,1,2 -> (0, 1, 2) (argparse's type: a bad list is a usage error)."""
    import argparse

    try:
        seeds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds must be comma-separated integers; got {text!r}") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"seeds must be distinct and at least one; got {text!r}")
    return seeds


def load(path: Path) -> Protocol:
    path = Path(path)
    return parse(path.read_bytes(), path)


@lru_cache(maxsize=1)
def protocol() -> Protocol:
    """The protocol of this checkout (results/validation/) or of the installed wheel."""
    from specscale.resources import validation_protocol

    return load(validation_protocol())


def protocol_hash() -> str:
    """sha256 of the protocol file's bytes, first 12 hex digits (written on every look)."""
    return protocol().hash
