"""Range checks that name the setting, and the known top-level keys."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Mapping, Optional

from specscale.settings.search_policy import ConfigError


def check_int(key: str, value: Any, low: int = 1, null: bool = False) -> Optional[int]:
    """value as an int >= low, or a ConfigError naming key (bools and floats are rejected)."""
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        allowed = f"an integer >= {low}" + (" or null" if null else "")
        raise ConfigError(f"{key} must be {allowed}, got {value!r}")
    return value


def check_number(key: str, value: Any, low: float, high: Optional[float] = None, low_open: bool = True) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        ok = (value > low if low_open else value >= low) and (high is None or value <= high)
    if not ok:
        lo = f"{'(' if low_open else '['}{low}"
        hi = f"{high}]" if high is not None else "inf)"
        raise ConfigError(f"{key} must be a number in {lo}, {hi}, got {value!r}")
    return float(value)


@functools.lru_cache(maxsize=4)
def known_top_level_keys(conf_dir: Optional[str] = None) -> frozenset[str]:
    """The top-level keys of conf/config.yaml: its own settings and its config groups."""
    from omegaconf import OmegaConf

    from specscale.compose import CONF_DIR

    primary = OmegaConf.to_container(OmegaConf.load(Path(conf_dir or CONF_DIR) / "config.yaml"))
    keys = {k for k in primary if k != "defaults"}
    for entry in primary.get("defaults", []):
        if isinstance(entry, dict):
            keys.update(str(k).split("@")[0].split("/")[0].lstrip("+") for k in entry if "hydra" not in str(k))
    return frozenset(keys | {"hydra"})


def reject_unknown_keys(cfg: Mapping[str, Any]) -> None:
    """A misspelt ``+beem=4`` would otherwise run the default beam under a new hash."""
    unknown = sorted(set(cfg) - known_top_level_keys())
    if unknown:
        raise ConfigError(f"unknown top-level setting(s) {unknown} (added with +?); known settings: "
                          f"{sorted(known_top_level_keys() - {'hydra'})}")
