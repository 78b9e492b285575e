"""Entry point: one cell per run, or a sweep with -m (Hydra).

    python run.py                                   # the default cell (engine=sim)
    python run.py policy=spec beam=4
    python run.py -m policy=nonspec,spec,ep,ep_cd,full beam=4,8
    python run.py -m +experiment=fig13_ablation engine=sim n_problems=16

Results go to <results_dir>/<experiment_name>/<dataset>/<model>/<policy>/b<beam>-c<conc>-s<seed>-<hash>/;
a cell whose summary exists is skipped, so rerunning a sweep resumes it. An installed
harness has the same entry point as the ``specscale`` command (specscale/cli.py).
"""
from __future__ import annotations

from specscale.cli import main

if __name__ == "__main__":
    main()
