"""Entry point: one cell per run, or a sweep with -m (Hydra).

    python run.py                                   # the default cell (engine=sim)
    python run.py policy=spec beam=4
    python run.py -m policy=nonspec,spec,ep,ep_cd,full beam=4,8
"""
from __future__ import annotations

from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from specscale.cell import format_summary, run_cell


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    out_dir = Path(HydraConfig.get().runtime.output_dir)
    summary = run_cell(cfg, out_dir, progress=bool(cfg.progress))
    print(format_summary(summary), end="")
    print(f"results: {out_dir}")
    return summary


if __name__ == "__main__":
    main()
