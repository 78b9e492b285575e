"""The CPU testbed: generator and PRM pairs trained by this project on the arith task.

``python -m runners.train_testbed`` trains a pair (deterministic for a seed) and writes
Hugging Face checkpoints, shipped as package data under ``specscale/testbed/weights/``:

* ``{generator,prm}``: the pair of ``model=testbed``, trained on ``dataset=arith``
  (``model.*.hf_name: testbed/generator``, ``testbed/prm``);
* ``levels/{generator,prm}``: the pair of ``model=testbed_levels``, trained on the difficulty
  levels 1-5 of ``dataset=arith_levels`` (``python -m runners.train_testbed --pair levels``;
  ``testbed/levels/generator``, ``testbed/levels/prm``).

``specscale.engine.checkpoints`` resolves the ``testbed/`` names to these directories.
"""

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
# name (after the testbed/ prefix) -> its directory under WEIGHTS_DIR
CHECKPOINTS = ("generator", "prm", "levels/generator", "levels/prm")


def checkpoint_dir(name: str) -> Path:
    if name not in CHECKPOINTS:
        raise ValueError(f"no testbed checkpoint {name!r}; choose one of {list(CHECKPOINTS)}")
    return WEIGHTS_DIR / name
