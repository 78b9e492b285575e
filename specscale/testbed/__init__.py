"""The CPU testbed: a generator and a PRM trained by this project on ``dataset=arith``.

``python -m runners.train_testbed`` trains both (deterministic for a seed) and writes
Hugging Face checkpoints under ``specscale/testbed/weights/{generator,prm}``, shipped as
package data; ``model=testbed`` serves them (``model.*.hf_name: testbed/generator``,
``testbed/prm``, resolved by ``specscale.engine.torch.build``).
"""

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
CHECKPOINTS = ("generator", "prm")


def checkpoint_dir(name: str) -> Path:
    if name not in CHECKPOINTS:
        raise ValueError(f"no testbed checkpoint {name!r}; choose one of {list(CHECKPOINTS)}")
    return WEIGHTS_DIR / name
