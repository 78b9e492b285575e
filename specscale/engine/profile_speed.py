"""Does a measured profile describe this machine now? The speed check of ``hardware=profiled/<name>``.

A profile (``runners.profile_engine``) prices the machine that made it, at the speed it had
then. Used elsewhere, or on the same machine when it runs slower, its predictions are off
by the speed difference, and nothing in the numbers says so: a CPU profile made on one
2-core VM over-predicted another VM of the same kind by up to 82%, which ran 1.5x slower by
the probe. So the profile records two probe times (``meta.probe_s``: small generation and
PRM batches on the torch engine, ``specscale.engine.torch.profiler.speed_probe``;
``meta.host_probe_s``: fixed interpreter work, ``specscale.engine.host_probe``), and a sim
run on it times both again here:

* a ratio (seconds now over seconds then) off by more than ``TOLERANCE`` warns, naming the
  ratio and the fix (profile this machine, or rescale);
* ``engine.rescale_to_probe=true`` multiplies the profile's device coefficients by the
  device ratio and its host terms by the host ratio (by the device ratio, said in the
  note, when an older profile has no host probe);
* the summary records both ratios and whether they were applied
  (``profile_device_probe_ratio``, ``profile_host_probe_ratio``, ``profile_rescaled``).

The device probe needs the profiled model pair on this machine's device: it builds the
torch engine once per process (seconds for a tiny pair on a CPU). It runs only where the
profile's device kind is here (a CPU profile on any machine; a CUDA profile where CUDA
is); elsewhere the profile's device check warns instead. ``engine.probe_check=false``
skips it all (the fidelity check times its own probe around every torch run).

This module sits above the sim and the torch engine: the sim never imports the torch
engine, and this is the one place that needs both.
"""
from __future__ import annotations

import functools
import statistics
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from specscale.compose import compose_config
from specscale.engine.host_probe import host_probe
from specscale.engine.sim.build import build_sim
from specscale.engine.torch.build import build_torch
from specscale.engine.torch.profiler import speed_probe
from specscale.settings import CellSpec
from specscale.settings.search_policy import ConfigError

TOLERANCE = 0.10  # a probe ratio further than this from 1 warns


@dataclass(frozen=True)
class SpeedCheck:
    """This machine's probe seconds over the profile's, and whether the sim applied them."""

    device_ratio: Optional[float]  # None: the device probe could not run here (note says why)
    host_ratio: Optional[float]  # None: the profile records no host probe
    rescaled: bool
    note: str = ""

    def factors(self) -> tuple[float, float]:
        """(device, host) factors to rescale by: the host ratio, else the device ratio."""
        if self.device_ratio is None:
            raise ConfigError(f"engine.rescale_to_probe=true, but {self.note}")
        return self.device_ratio, self.host_ratio if self.host_ratio is not None else self.device_ratio

    def mismatches(self) -> list[str]:
        return [f"{kind} probe {r:.2f}x the profiled time" for kind, r in
                (("device", self.device_ratio), ("host", self.host_ratio))
                if r is not None and abs(r - 1.0) > TOLERANCE]

    def summary(self) -> dict[str, Any]:
        return {"profile_device_probe_ratio": self.device_ratio, "profile_host_probe_ratio": self.host_ratio,
                "profile_rescaled": self.rescaled}


# Readings of the device probe a sim run takes (their median): one reading of a drifting
# machine once read 1.71x the profiled time while the fidelity runs around it read 1.14x.
PROBE_READINGS = 5


@functools.cache
def _device_probe_s(overrides: tuple[str, ...]) -> float:
    """The device probe on this machine, on the profiled pair: the median of
    ``PROBE_READINGS`` readings (once per process: it builds the torch engine)."""
    threads = torch.get_num_threads()
    try:
        cfg = compose_config(["engine=torch", *overrides, "n_problems=1", "progress=false", "wandb.mode=disabled"],
                             resolve=True)
        backend, _ = build_torch(CellSpec.from_config(cfg))
        return statistics.median(speed_probe(backend.runner, backend.prm) for _ in range(PROBE_READINGS))
    finally:
        torch.set_num_threads(threads)  # build_torch sets the profile's threads process-wide


def _probe_overrides(profile: Mapping[str, Any]) -> tuple[Optional[tuple[str, ...]], str]:
    """The torch engine settings the profile was measured with, or why there are none here."""
    meta = profile.get("meta") or {}
    device = str(profile.get("device", ""))
    overrides = list(meta.get("overrides") or ([f"model={meta['model']}"] if meta.get("model") else []))
    if not overrides:
        return None, "the profile names no model pair to probe (meta.overrides / meta.model)"
    if device.startswith("CPU"):
        return tuple([*overrides, "engine.device=cpu", f"engine.cpu_threads={int(meta.get('threads') or 1)}"]), ""
    if not torch.cuda.is_available():
        return None, f"the profile was measured on {device!r} and this machine has no CUDA device to probe"
    return tuple([*overrides, "engine.device=cuda"]), ""


def check_speed(profile: Mapping[str, Any], rescale: bool) -> Optional[SpeedCheck]:
    """Time both probes here against the profile's (None: the profile records no probe)."""
    meta = profile.get("meta") or {}
    if not meta.get("probe_s"):
        if rescale:
            raise ConfigError("engine.rescale_to_probe=true, but this profile records no speed probe "
                             "(meta.probe_s): profile the machine again with runners.profile_engine")
        return None
    overrides, note = _probe_overrides(profile)
    device_ratio = _device_probe_s(overrides) / float(meta["probe_s"]) if overrides else None
    host_ratio = host_probe() / float(meta["host_probe_s"]) if meta.get("host_probe_s") else None
    if host_ratio is None:
        note = "; ".join(filter(None, [note, "no host probe recorded: host terms follow the device ratio"]))
    check = SpeedCheck(device_ratio, host_ratio, rescale, note)
    off = check.mismatches()
    if off and not rescale:
        warnings.warn(f"cost profile {profile.get('device')!r} (profiled {meta.get('profiled_at', '?')}): this machine "
                      f"runs at a different speed now ({'; '.join(off)}), so its predictions are off by about as "
                      "much. Profile this machine (python -m runners.profile_engine) or rescale the profile "
                      "(engine.rescale_to_probe=true)", stacklevel=2)
    return check


def build_sim_checked(spec: CellSpec):
    """The sim's backend and problems, its profile (if any) checked against this machine's speed."""
    cfg = spec.resolved()
    eng, profile = cfg["engine"], (cfg["hardware"] or {}).get("profile")
    rescale = bool(eng.get("rescale_to_probe", False))
    speed = None
    if profile is not None and (eng.get("probe_check", True) or rescale):
        speed = check_speed(profile, rescale)
    elif rescale:
        raise ConfigError("engine.rescale_to_probe=true needs a measured profile (hardware=profiled/<name>); "
                         f"hardware={cfg['hardware'].get('name')} is a datasheet roofline")
    return build_sim(spec, speed)
