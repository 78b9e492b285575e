"""The ``specscale`` command: ``python run.py`` for an installed harness.

    specscale policy=spec beam=4
    specscale -m +experiment=fig13_ablation hydra/launcher=slurm_gpu hydra.launcher.partition=gpu
    specscale show results/runs policy=full          # any store's cells at a glance (--csv OUT)
    specscale --dry-run [--list] -m +experiment=fig15_breakdown   # its cells: done / failed / pending

Same Hydra config (conf/, found by specscale.resources) and overrides as run.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


def task(cfg: DictConfig) -> dict[str, Any]:
    """One cell: run it into the results store and print its summary."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from specscale.settings import CellSpec
    from specscale.settings.search_policy import ConfigError, exit_on_config_error

    # The one place this cell's config is read: everything below reads the spec. It is
    # checked before the engines are imported (seconds), so a bad setting fails at once.
    try:
        spec = CellSpec.from_config(OmegaConf.to_container(cfg, resolve=True))
        if spec.engine.name == "vllm":  # an install that fails every vLLM cell: the fix, before the cell starts
            from specscale.settings.vllm_engine import check_vllm_imports

            check_vllm_imports()
    except ConfigError as exc:
        exit_on_config_error(exc)
    _print_notes(spec)

    from specscale.cell import format_summary
    from specscale.cell_job import DONE, FAILED, run_and_store

    single = HydraConfig.get().mode == RunMode.RUN
    try:
        result = run_and_store(spec)
    except ConfigError as exc:  # found while building the engine (a checkpoint, a vLLM limit): one line too
        if not single:
            raise  # a sweep's job: the sweeper re-raises it from the job's return and prints it so
        exit_on_config_error(exc)
    if result["status"] == DONE:
        print(format_summary(result["summary"]), end="")
    print(f"{result['status']}: {result['cell_dir']}")
    if single:  # a sweep prints one table of all its cells at the end (results/callbacks.py)
        from specscale.results import glance

        glance.render(glance.table(glance.read_cells([Path(result["cell_dir"])])), "this cell at a glance")
    if result["status"] == FAILED and single:
        # A sweep goes on past a failed cell (error.json records it); a single run says so.
        raise SystemExit(f"cell failed: see {result['cell_dir']}/error.json")
    return result


_NOTED: set[str] = set()


def _print_notes(spec) -> None:
    """A meaningful but easily mistaken pair (specscale/settings/pairings.py): one line on
    stderr, once per process (a sweep's cells share it), and the cell runs."""
    import sys

    from specscale.settings.pairings import pairing_notes

    for note in pairing_notes(spec.config):
        if note not in _NOTED:
            _NOTED.add(note)
            print(f"note: {note}", file=sys.stderr)


def main() -> None:
    import os
    import sys

    import hydra

    if "--debug" in sys.argv[1:]:  # full tracebacks (Hydra's own switch), not a Hydra flag
        sys.argv.remove("--debug")
        os.environ["HYDRA_FULL_ERROR"] = "1"
    if sys.argv[1:2] == ["show"]:  # specscale show RESULTS_DIR [KEY=VALUE ...] [--csv OUT]
        from specscale.results import glance

        raise SystemExit(glance.main(sys.argv[2:]))
    if "--dry-run" in sys.argv[1:] or "--list" in sys.argv[1:]:  # the sweep's cells and their states, run nothing
        from specscale.results.plan import main as plan_main

        raise SystemExit(plan_main(sys.argv[1:]))

    from specscale.resources import conf_dir

    _register_sweeper()
    hydra.main(version_base="1.3", config_path=str(conf_dir()), config_name="config")(task)()


def _register_sweeper() -> None:
    """Hydra finds plugins by walking the hydra_plugins namespace on sys.path, which misses
    an editable install run outside the checkout: register the skip-done sweeper directly."""
    from hydra.core.plugins import Plugins

    plugins = Plugins.instance()  # first: its scan re-executes plugin modules (BasicSweeper too)
    from hydra_plugins.specscale_sweeper.skip_done_sweeper import SkipDoneSweeper

    plugins.register(SkipDoneSweeper)


if __name__ == "__main__":
    main()
