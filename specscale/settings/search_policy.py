"""Typed, validated views of the Hydra config that the core code consumes.

Hydra/OmegaConf gives us composition and overrides; these dataclasses give the rest of
the code plain attributes and fail early, with a message that names the setting, on
values that would otherwise produce a silently wrong run.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from typing import Any, Mapping, NoReturn

SPECULATION_MODES = ("none", "naive", "extension")
PRUNING_MODES = ("off", "strict", "shortcut")
VERIFICATION_MODES = ("barrier", "immediate", "lazy", "adaptive")
# Lazy verification's readings of Algorithm 3 where the paper leaves a choice (docs/design.md §3).
LV_VOLUMES = ("input", "new")
LV_SIBLING_FLUSHES = ("group", "all")
LV_DEFERRALS = ("decisions", "iterations")
SCORE_AGGREGATIONS = ("last", "min", "prod")
# The searches the controller runs (specscale/search/rules.py; docs/design.md §2.1).
SEARCH_KINDS = ("beam", "best_of_n", "dvts", "rebase")


class ConfigError(ValueError):
    """A configuration value that cannot produce a meaningful run."""


class RefusedPair(ConfigError):
    """A search and a policy that mean nothing together (``check_search_policy``). A sweep
    over searches x policies drops such jobs and counts them; a single run stops."""


def exit_on_config_error(exc: ConfigError) -> NoReturn:
    """A bad setting as the command line says it: one line on stderr (the message names the
    key, the value, what is allowed and the fix) and exit status 2, no traceback; with
    ``--debug`` or HYDRA_FULL_ERROR=1 the error goes on to Hydra, which prints it whole."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise exc
    print(f"error: {exc}", file=sys.stderr)
    raise SystemExit(2)


def _pick(cls, mapping: Mapping[str, Any], ignore: tuple[str, ...] = ()):
    names = {f.name for f in fields(cls)}
    unknown = set(mapping) - names - set(ignore)
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown setting(s) {sorted(unknown)}; known: {sorted(names)}")
    return cls(**{k: v for k, v in mapping.items() if k in names})


@dataclass(frozen=True)
class SearchConfig:
    """The search of docs/design.md §2, identical for every policy."""

    beam: int = 8
    expansion: int = 4
    max_rounds: int = 40
    temperature: float = 0.8
    top_p: float = 1.0
    step_token_cap: int = 512
    path_token_cap: int = 4096
    score_agg: str = "last"
    kind: str = "beam"  # beam | best_of_n | dvts | rebase (conf/search/)
    rebase_temperature: float = 0.2  # rebase: softmax temperature of the child allocation (conf/search/rebase.yaml)

    def __post_init__(self) -> None:
        if self.kind not in SEARCH_KINDS:
            raise ConfigError(f"search.kind must be one of {SEARCH_KINDS} (search=NAME), got {self.kind!r}")
        t = self.rebase_temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise ConfigError(f"search.rebase_temperature must be a number > 0, got {t!r}")
        if self.expansion < 1:
            raise ConfigError(f"expansion must be >= 1, got {self.expansion}")
        # Best-of-N gives every path one child: M means nothing there, so any beam goes.
        if self.beam < 1 or (self.kind != "best_of_n" and self.beam % self.expansion):
            raise ConfigError(
                f"beam ({self.beam}) must be a positive multiple of expansion ({self.expansion}): "
                "K = beam / expansion parents are retained each round"
            )
        if self.max_rounds < 1:
            raise ConfigError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.step_token_cap < 1 or self.path_token_cap < 1:
            raise ConfigError("step_token_cap and path_token_cap must be >= 1")
        if self.score_agg not in SCORE_AGGREGATIONS:
            raise ConfigError(f"score_agg must be one of {SCORE_AGGREGATIONS}, got {self.score_agg!r}")

    @property
    def keep(self) -> int:
        """K: parents retained per round."""
        return self.beam // self.expansion

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any]) -> "SearchConfig":
        return _pick(cls, mapping)


@dataclass(frozen=True)
class PolicyConfig:
    """A policy is data: the switches of docs/design.md §3."""

    name: str = "custom"
    speculation: str = "none"  # none | naive | extension (FastTTS beam extension)
    depth: int = 1  # max unresolved ancestors of a running candidate
    pruning: str = "off"  # off | strict | shortcut (strict + perfect-score shortcut)
    dedup: bool = False  # computation deduplication (CD)
    verification: str = "barrier"  # barrier | immediate | lazy (LV) | adaptive (specscale/verify/adaptive.py)
    lookahead: bool = False  # FastTTS: score a finished child 0 with its parent at the barrier
    b_max: int = 2048  # LV: flush when pending PRM input tokens reach this
    d_max: int = 6  # LV: flush when a task has been deferred this many times
    sibling_trigger: bool = True  # LV, adaptive: flush when a sibling group has entirely finished its step
    age_cap_s: float | None = None  # LV, adaptive: optional wall-clock (modelled) age cap, seconds
    # LV: what B_max counts: each task's scoring input (its whole PRM input: the question, its
    # path, the closing tokens) or only the tokens the PRM computes anew (with its prefix cache)
    lv_volume: str = "input"
    # LV: what a completed sibling group flushes: the tasks of the groups that have completed
    # (group; the rest keep accumulating towards B_max), or every pending task (all)
    lv_sibling_flush: str = "group"
    # LV: what d_max counts: verification decisions that passed a task over (decisions) or
    # generation iterations it waited through (iterations)
    lv_deferral: str = "decisions"

    def __post_init__(self) -> None:
        if self.speculation not in SPECULATION_MODES:
            raise ConfigError(f"policy.speculation must be one of {SPECULATION_MODES}, got {self.speculation!r}")
        if self.pruning not in PRUNING_MODES:
            raise ConfigError(f"policy.pruning must be one of {PRUNING_MODES}, got {self.pruning!r}")
        if self.verification not in VERIFICATION_MODES:
            raise ConfigError(
                f"policy.verification must be one of {VERIFICATION_MODES}, got {self.verification!r}"
            )
        if self.depth < 1:
            raise ConfigError(f"policy.depth must be >= 1, got {self.depth}")
        if self.b_max <= 0:
            raise ConfigError(f"policy.b_max (LV token threshold) must be positive, got {self.b_max}")
        if self.d_max <= 0:
            raise ConfigError(f"policy.d_max (LV deferral limit) must be positive, got {self.d_max}")
        if self.age_cap_s is not None and self.age_cap_s <= 0:
            raise ConfigError(f"policy.age_cap_s must be positive or null, got {self.age_cap_s}")
        for key, value, allowed in (("lv_volume", self.lv_volume, LV_VOLUMES),
                                    ("lv_sibling_flush", self.lv_sibling_flush, LV_SIBLING_FLUSHES),
                                    ("lv_deferral", self.lv_deferral, LV_DEFERRALS)):
            if value not in allowed:
                raise ConfigError(f"policy.{key} must be one of {allowed}, got {value!r}")
        if self.lookahead and self.speculation != "extension":
            raise ConfigError("policy.lookahead needs speculation=extension (FastTTS)")

    @property
    def speculative(self) -> bool:
        return self.speculation != "none"

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any]) -> "PolicyConfig":
        return _pick(cls, mapping)


# Which values of the policy switches (docs/design.md §3) mean something on each search
# (docs/design.md §2.1). Dedup and verification change only the cost of scoring and
# sampling, never a selection, so every search takes all of them; speculation and early
# pruning act on a selection, so they need one that is known member by member.
_ALL_SWITCHES = {"speculation": SPECULATION_MODES, "pruning": PRUNING_MODES, "dedup": (False, True),
                 "verification": VERIFICATION_MODES}
_NO_SELECTION_SWITCHES = {**_ALL_SWITCHES, "speculation": ("none",), "pruning": ("off",)}
POLICY_SWITCHES_BY_SEARCH: dict[str, dict[str, tuple]] = {
    "beam": _ALL_SWITCHES,
    "dvts": _ALL_SWITCHES,  # per subtree: top-1 selection, pruning and the shortcut with K = 1
    "best_of_n": _NO_SELECTION_SWITCHES,
    "rebase": _NO_SELECTION_SWITCHES,
}
# Why a refused value means nothing on that search (the error message says it).
_REFUSED_BECAUSE = {
    ("best_of_n", "speculation"): "every path gets its next step as soon as its step ends, "
                                  "so there is no selection to speculate on",
    ("best_of_n", "pruning"): "nothing is selected away, so there is no threshold to prune below",
    ("rebase", "speculation"): "a member's child count is unknown until every score of its round is in",
    ("rebase", "pruning"): "the child allocation needs every score of the round",
}


def check_search_policy(search: SearchConfig, policy: PolicyConfig) -> None:
    """Refuse policy switches that have nothing to act on in the search (one line, with the fix)."""
    matrix = POLICY_SWITCHES_BY_SEARCH[search.kind]
    refused = [(k, getattr(policy, k), ok) for k, ok in matrix.items() if getattr(policy, k) not in ok]
    if refused:
        switch = refused[0][0]
        why = _REFUSED_BECAUSE.get((search.kind, switch), "it has nothing to act on there")
        raise RefusedPair(
            f"search.kind={search.kind} cannot run {', '.join(f'policy.{k}={v}' for k, v, _ in refused)} "
            f"(policy={policy.name}): {why}; use policy=nonspec or policy=nonspec_cd "
            f"(or set {' '.join(f'policy.{k}={ok[0]}' for k, _, ok in refused)})")
