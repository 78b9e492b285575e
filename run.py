"""Entry point: one cell per run, or a sweep with -m (Hydra).

    python run.py                                   # the default cell (engine=sim)
    python run.py policy=spec beam=4
    python run.py -m policy=nonspec,spec,ep,ep_cd,full beam=4,8
    python run.py -m +experiment=fig13_ablation engine=sim n_problems=16

Results go to <results_dir>/<experiment_name>/<dataset>/<model>/<policy>/b<beam>-c<conc>-s<seed>-<hash>/;
a cell whose summary exists is skipped, so rerunning a sweep resumes it.
"""
from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from specscale.cell import format_summary
from specscale.results.runner import DONE, FAILED, run_and_store


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    result = run_and_store(OmegaConf.to_container(cfg, resolve=True))
    if result["status"] == DONE:
        print(format_summary(result["summary"]), end="")
    print(f"{result['status']}: {result['cell_dir']}")
    if result["status"] == FAILED and HydraConfig.get().mode == RunMode.RUN:
        # A sweep goes on past a failed cell (error.json records it); a single run says so.
        raise SystemExit(f"cell failed: see {result['cell_dir']}/error.json")
    return result


if __name__ == "__main__":
    main()
