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
from omegaconf import DictConfig, OmegaConf

from specscale.cell import format_summary
from specscale.results.runner import DONE, run_and_store


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    result = run_and_store(OmegaConf.to_container(cfg, resolve=True))
    if result["status"] == DONE:
        print(format_summary(result["summary"]), end="")
    print(f"{result['status']}: {result['cell_dir']}")
    return result


if __name__ == "__main__":
    main()
