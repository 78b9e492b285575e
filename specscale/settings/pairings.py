"""Model / dataset / workload / hardware pairs that compose but describe no experiment.

Each group composes on its own, so ``engine=sim model=testbed`` ran silently on the
default synthetic workload (MATH-like steps, an A100 roofline) although the testbed's
sim workload is the fitted group ``synthetic=testbed``. ``check_pairing`` refuses such
pairs with the fix (a ConfigError, one line on the command line); ``pairing_notes`` names
pairs that are meaningful but easy to pick by mistake (the ``specscale`` command prints
them, one line each, and runs the cell).

The rules (model names are ``model.name``, datasets ``dataset.name``):

* ``model=testbed`` is trained on ``dataset=arith`` (conf/model/testbed.yaml); its
  other splits (``dataset=arith_levels``: difficulty levels 1-5, and the hard split) are
  the same task, so they pair too (a note says where the shipped pair was not trained);
  any other dataset is refused, on every engine.
* ``model=testbed`` on ``engine=sim`` needs the fitted workload (conf/synthetic/testbed.yaml);
  ``synthetic=testbed`` on ``engine=sim`` needs ``model=testbed`` (it is fitted to that pair).
* notes: ``synthetic=testbed`` on engine=torch/vllm (read only by engine=sim and
  engine.synthetic_tokens=true); a tiny random-weight pair (``model=tiny*``) priced on a
  datasheet GPU by engine=sim; ``dataset=arith`` with a model not trained on it.

Whether the fitted group is in the config: Hydra does not record a group choice in the
composed config, and the group only sets values (engine.synthetic.*, engine.problems.*,
dataset.sim.*) whose keys every engine=sim config has. So the group counts as selected
when MOST of the leaves it sets (read from the group file, which a refit rewrites) hold
its values in this config: without the group almost none do (one, head_tokens, by
coincidence today), with it all do, less the few a user or a test overrides on top
(tests/cfg_helpers.py's SMALL overrides three of seventeen).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from specscale.settings.search_policy import ConfigError

TESTBED_MODEL = "testbed"
TESTBED_DATASET = "arith"
# The testbed's task in every split: the shipped pair is trained on arith (2-4 operations on
# 0..49); arith_levels reaches 6 operations on 0..99 (python -m runners.train_testbed --levels).
TESTBED_TASKS = (TESTBED_DATASET, "arith_levels")
TESTBED_PROFILE = "profiled/cpu-testbed"  # the sim's price list for the testbed on this kind of CPU
FITTED_GROUP = Path("synthetic") / "testbed.yaml"  # under the conf dir
TINY_MODELS = ("tiny", "tiny_vllm", "tiny_vllm_rlhflow")

_LEAVES: dict[Path, tuple[int, dict]] = {}  # group file -> (mtime_ns, its leaves)


def _flatten(node: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    if isinstance(node, Mapping):
        out: dict[tuple, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, (*prefix, str(key))))
        return out
    return {prefix: node}


def fitted_leaves(conf: Optional[Path] = None) -> dict[tuple, Any]:
    """The leaves conf/synthetic/testbed.yaml sets ({} where the installation lacks it).
    Re-read when the file changes (runners.fit_testbed_workload rewrites it, then runs it)."""
    from specscale.resources import conf_dir

    path = Path(conf or conf_dir()) / FITTED_GROUP
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


def uses_fitted_workload(cfg: Mapping[str, Any], conf: Optional[Path] = None) -> Optional[bool]:
    """Whether the config carries the fitted group synthetic=testbed (the rule above);
    None when there is no group file to compare with."""
    leaves = fitted_leaves(conf)
    if not leaves:
        return None
    hits = sum(1 for key, value in leaves.items() if _get(cfg, key) == value)
    return 2 * hits > len(leaves)


def _names(cfg: Mapping[str, Any]) -> tuple[str, str, str]:
    engine = str((cfg.get("engine") or {}).get("name"))
    return engine, str((cfg.get("model") or {}).get("name")), str((cfg.get("dataset") or {}).get("name"))


def _hardware(cfg: Mapping[str, Any]) -> tuple[str, bool]:
    hw = cfg.get("hardware") or {}
    return str(hw.get("name")), "profile" in hw


def check_pairing(cfg: Mapping[str, Any]) -> None:
    """Refuse a pair that describes no experiment, naming the fix (the rules above)."""
    engine, model, dataset = _names(cfg)
    wrong_task = model == TESTBED_MODEL and dataset not in TESTBED_TASKS
    fitted = uses_fitted_workload(cfg) if engine == "sim" else None
    if model == TESTBED_MODEL and fitted is False:
        hardware, profiled = _hardware(cfg)
        fix = "add synthetic=testbed" + ("" if profiled else
                                         f" (and hardware={TESTBED_PROFILE} to price it as this CPU, not {hardware})")
        needs = "its fitted workload (conf/synthetic/testbed.yaml)"
        if wrong_task:
            needs, fix = f"its task and {needs}", f"set dataset={TESTBED_DATASET} and {fix}"
        raise ConfigError(f"model={TESTBED_MODEL} on engine=sim needs {needs}: {fix}")
    if wrong_task:
        raise ConfigError(f"model={TESTBED_MODEL} is trained on dataset={TESTBED_DATASET} only (conf/model/testbed.yaml), "
                          f"not dataset={dataset}: set dataset={TESTBED_DATASET} (or drop dataset={dataset}: the pair "
                          "selects it)")
    if fitted and model != TESTBED_MODEL:
        raise ConfigError(f"synthetic=testbed is the workload fitted to model={TESTBED_MODEL} on "
                          f"dataset={TESTBED_DATASET}, not model={model}: add model={TESTBED_MODEL} "
                          "or drop synthetic=testbed")


def _own_weights(cfg: Mapping[str, Any]) -> bool:
    """Whether the testbed pair's weights were pointed elsewhere than the shipped checkpoints."""
    model = cfg.get("model") or {}
    return any(not str((model.get(role) or {}).get("hf_name", "")).startswith("testbed/") for role in ("generator", "prm"))


def pairing_notes(cfg: Mapping[str, Any]) -> list[str]:
    """Meaningful pairs that are easy to pick by mistake: one line each (the rules above)."""
    engine, model, dataset = _names(cfg)
    notes = []
    if engine != "sim" and not (cfg.get("engine") or {}).get("synthetic_tokens") and uses_fitted_workload(cfg):
        notes.append(f"synthetic=testbed shapes engine=sim's workload only: engine={engine} runs the real pair's "
                     "tokens and scores (drop synthetic=testbed)")
    if engine == "sim" and model in TINY_MODELS:
        hardware, profiled = _hardware(cfg)
        if not profiled:
            notes.append(f"engine=sim prices the tiny random-weight pair model={model} on {hardware}'s datasheet "
                         "roofline; for this CPU's timings add hardware=profiled/cpu-tiny")
    if model == TESTBED_MODEL and dataset != TESTBED_DATASET and not _own_weights(cfg):
        notes.append(f"model={TESTBED_MODEL}'s shipped pair is trained on dataset={TESTBED_DATASET} (2-4 operations on "
                     f"0..49); dataset={dataset} goes beyond it: train a pair for it (python -m runners.train_testbed "
                     "--levels 1,2,3,4,5 --out DIR) and set model.generator.hf_name / model.prm.hf_name to DIR")
    if dataset in TESTBED_TASKS and model != TESTBED_MODEL:
        notes.append(f"dataset={dataset} is the testbed's task (specscale/data/arith.py); model={model} "
                     f"was not trained on it (model={TESTBED_MODEL} was)")
    return notes
