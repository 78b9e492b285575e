"""Model / dataset / workload / hardware pairs that compose but describe no experiment.

Each group composes on its own, so ``engine=sim model=testbed`` ran silently on the
default synthetic workload (MATH-like steps, an A100 roofline) although the testbed's
sim workload is the fitted group ``synthetic=testbed``. ``check_pairing`` refuses such
pairs with the fix (a ConfigError, one line on the command line); ``pairing_notes`` names
pairs that are meaningful but easy to pick by mistake (the ``specscale`` command prints
them, one line each, and runs the cell).

The rules (model names are ``model.name``, datasets ``dataset.name``). The testbed pairs are
``TESTBED_PAIRS``: ``model=testbed`` (trained on ``dataset=arith``, fitted workload
``synthetic=testbed``) and ``model=testbed_levels`` (trained on ``dataset=arith_levels``,
``synthetic=testbed_levels``):

* a testbed pair runs the testbed's task in any split (``TESTBED_TASKS``: arith, and
  arith_levels with its difficulty levels 1-5 and hard split); a note says where a split
  goes beyond a shipped pair's training; any other dataset is refused, on every engine.
* a testbed pair on ``engine=sim`` needs its own fitted workload (``conf/synthetic/<group>.yaml``);
  a fitted group on ``engine=sim`` needs its own pair (it is fitted to that pair).
* notes: a fitted group on engine=torch/vllm (read only by engine=sim and
  engine.synthetic_tokens=true); a tiny random-weight pair (``model=tiny*``) priced on a
  datasheet GPU by engine=sim; the testbed's task with a model not trained on it.

Whether a fitted group is in the config: Hydra does not record a group choice in the
composed config, and the group only sets values (engine.synthetic.*, engine.problems.*,
dataset.sim.*) whose keys every engine=sim config has. So a group counts as selected
when MOST of the leaves it sets (read from the group file, which a refit rewrites) hold
its values in this config: without the group almost none do (one, head_tokens, by
coincidence today), with it all do, less the few a user or a test overrides on top
(tests/cfg_helpers.py's SMALL overrides three of seventeen). Two pairs' groups set the same
keys to values fitted apart, so at most one of them is selected.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from specscale.settings.search_policy import ConfigError


@dataclass(frozen=True)
class TestbedPair:
    """A trained testbed pair and what the sim needs to model it."""

    __test__ = False  # a name pytest would otherwise collect where a test module imports it

    model: str       # model.name (conf/model/<model>.yaml)
    dataset: str     # the dataset it is trained on
    trained_on: str  # the training distribution, in words
    synthetic: str   # its fitted sim workload: conf/synthetic/<synthetic>.yaml
    profile: str     # its cost profile on this kind of CPU: hardware=<profile>
    covers: tuple[str, ...]  # the datasets within its training distribution (others get a note)

    @property
    def group_file(self) -> Path:  # under the conf dir
        return Path("synthetic") / f"{self.synthetic}.yaml"


TESTBED_PAIRS = (
    TestbedPair("testbed", "arith", "2-4 operations on 0..49", "testbed", "profiled/cpu-testbed", ("arith",)),
    # arith's problems (2-4 operations on 0..49) lie within levels 2-4
    TestbedPair("testbed_levels", "arith_levels", "difficulty levels 1-5", "testbed_levels",
                "profiled/cpu-testbed-levels", ("arith_levels", "arith")),
)
# The testbed's task in every split a pair covers (specscale/data/arith.py): arith (2-4
# operations on 0..49) and arith_levels (levels 1-5 up to 6 operations on 0..99, and the hard split).
TESTBED_TASKS = tuple(dict.fromkeys(d for pair in TESTBED_PAIRS for d in (pair.dataset, *pair.covers)))
TINY_MODELS = ("tiny", "tiny_vllm", "tiny_vllm_rlhflow")

_LEAVES: dict[Path, tuple[int, dict]] = {}  # group file -> (mtime_ns, its leaves)


def testbed_pair(model: str) -> TestbedPair:
    """The testbed pair ``model=<model>``; KeyError naming the pairs when there is none."""
    pair = _pair(model)
    if pair is not None:
        return pair
    raise KeyError(f"model={model} is not a testbed pair; choose one of {[p.model for p in TESTBED_PAIRS]}")


def _flatten(node: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    if isinstance(node, Mapping):
        out: dict[tuple, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, (*prefix, str(key))))
        return out
    return {prefix: node}


def fitted_leaves(pair: TestbedPair = TESTBED_PAIRS[0], conf: Optional[Path] = None) -> dict[tuple, Any]:
    """The leaves ``pair``'s fitted group sets ({} where the installation lacks it).
    Re-read when the file changes (runners.fit_testbed_workload rewrites it, then runs it)."""
    from specscale.resources import conf_dir

    path = Path(conf or conf_dir()) / pair.group_file
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return {}
    cached = _LEAVES.get(path)
    if cached is None or cached[0] != mtime:
        from omegaconf import OmegaConf

        cached = (mtime, _flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}))
        _LEAVES[path] = cached
    return cached[1]


def _get(cfg: Mapping[str, Any], key: tuple) -> Any:
    node: Any = cfg
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return list(node) if isinstance(node, (list, tuple)) else node


_MISSING = object()


def uses_fitted_workload(cfg: Mapping[str, Any], pair: TestbedPair = TESTBED_PAIRS[0],
                         conf: Optional[Path] = None) -> Optional[bool]:
    """Whether the config carries ``pair``'s fitted group (the rule above); None when there is
    no group file to compare with."""
    leaves = fitted_leaves(pair, conf)
    if not leaves:
        return None
    hits = sum(1 for key, value in leaves.items() if _get(cfg, key) == value)
    return 2 * hits > len(leaves)


def selected_group(cfg: Mapping[str, Any]) -> Optional[TestbedPair]:
    """The testbed pair whose fitted group the config carries, if any."""
    return next((pair for pair in TESTBED_PAIRS if uses_fitted_workload(cfg, pair)), None)


def _names(cfg: Mapping[str, Any]) -> tuple[str, str, str]:
    engine = str((cfg.get("engine") or {}).get("name"))
    return engine, str((cfg.get("model") or {}).get("name")), str((cfg.get("dataset") or {}).get("name"))


def _hardware(cfg: Mapping[str, Any]) -> tuple[str, bool]:
    hw = cfg.get("hardware") or {}
    return str(hw.get("name")), "profile" in hw


def _pair(model: str) -> Optional[TestbedPair]:
    return next((pair for pair in TESTBED_PAIRS if pair.model == model), None)


def check_pairing(cfg: Mapping[str, Any]) -> None:
    """Refuse a pair that describes no experiment, naming the fix (the rules above)."""
    engine, model, dataset = _names(cfg)
    pair = _pair(model)
    wrong_task = pair is not None and dataset not in TESTBED_TASKS
    group = selected_group(cfg) if engine == "sim" else None
    # None: the pair's group file is missing (an installation without it): nothing to check
    if pair is not None and engine == "sim" and group is not pair and uses_fitted_workload(cfg, pair) is not None:
        hardware, profiled = _hardware(cfg)
        fix = f"add synthetic={pair.synthetic}" + ("" if profiled else f" (and hardware={pair.profile} to price it "
                                                                        f"as this CPU, not {hardware})")
        if group is not None:
            fix = f"replace synthetic={group.synthetic} (fitted to model={group.model}) by synthetic={pair.synthetic}"
        needs = f"its fitted workload (conf/{pair.group_file.as_posix()})"
        if wrong_task:
            needs, fix = f"its task and {needs}", f"set dataset={pair.dataset} and {fix}"
        raise ConfigError(f"model={model} on engine=sim needs {needs}: {fix}")
    if wrong_task:
        raise ConfigError(f"model={model} is trained on dataset={pair.dataset} (conf/model/{model}.yaml), "
                          f"not dataset={dataset}: set dataset={pair.dataset} (or drop dataset={dataset}: the pair "
                          "selects it)")
    if group is not None and pair is None:
        raise ConfigError(f"synthetic={group.synthetic} is the workload fitted to model={group.model} on "
                          f"dataset={group.dataset}, not model={model}: add model={group.model} "
                          f"or drop synthetic={group.synthetic}")


def _own_weights(cfg: Mapping[str, Any]) -> bool:
    """Whether the testbed pair's weights were pointed elsewhere than the shipped checkpoints."""
    model = cfg.get("model") or {}
    return any(not str((model.get(role) or {}).get("hf_name", "")).startswith("testbed/") for role in ("generator", "prm"))


def pairing_notes(cfg: Mapping[str, Any]) -> list[str]:
    """Meaningful pairs that are easy to pick by mistake: one line each (the rules above)."""
    engine, model, dataset = _names(cfg)
    pair = _pair(model)
    notes = []
    group = selected_group(cfg) if engine != "sim" and not (cfg.get("engine") or {}).get("synthetic_tokens") else None
    if group is not None:
        notes.append(f"synthetic={group.synthetic} shapes engine=sim's workload only: engine={engine} runs the real "
                     f"pair's tokens and scores (drop synthetic={group.synthetic})")
    if engine == "sim" and model in TINY_MODELS:
        hardware, profiled = _hardware(cfg)
        if not profiled:
            notes.append(f"engine=sim prices the tiny random-weight pair model={model} on {hardware}'s datasheet "
                         "roofline; for this CPU's timings add hardware=profiled/cpu-tiny")
    if pair is not None and dataset not in pair.covers and not _own_weights(cfg):
        other = next((p for p in TESTBED_PAIRS if p.dataset == dataset), None)
        fix = (f"model={other.model} is the pair trained on it" if other is not None else
               "train a pair for it (python -m runners.train_testbed --levels 1,2,3,4,5 --out DIR) and set "
               "model.generator.hf_name / model.prm.hf_name to DIR")
        notes.append(f"model={model}'s shipped pair is trained on dataset={pair.dataset} ({pair.trained_on}); "
                     f"dataset={dataset} goes beyond it: {fix}")
    if dataset in TESTBED_TASKS and pair is None:
        trained = " or ".join(f"model={p.model}" for p in TESTBED_PAIRS if p.dataset == dataset)
        notes.append(f"dataset={dataset} is the testbed's task (specscale/data/arith.py); model={model} "
                     f"was not trained on it ({trained} was)")
    return notes
