"""Write the trained testbed models as Hugging Face checkpoints.

generator/  Qwen2ForCausalLM through ``save_pretrained`` (config.json, model.safetensors,
            generation_config.json) + the tokenizer;
prm/        Qwen2ForProcessRewardModel in the released Qwen2.5-Math-PRM layout: config.json
            naming that architecture, ``model.*`` + ``score.0.*`` + ``score.2.*`` in
            model.safetensors (no LM head) + the same tokenizer. transformers has no class
            for it (the hub's is remote code), so ``AutoModel.from_pretrained`` reads it as
            the Qwen2 body (``model.*``) and leaves the score head aside.

Both are float32 (a few MB). Written to a temporary directory and moved into place, so
an interrupted run never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from specscale.testbed.tokenizer import save_tokenizer


def _replace_dir(tmp: Path, target: Path) -> None:
    # mkdtemp / safetensors create private files; shipped package data must be readable.
    tmp.chmod(0o755)
    for f in tmp.iterdir():
        f.chmod(0o644)
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(tmp), str(target))


def save_generator(model, tokenizer, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".generator-", dir=target.parent))
    model.save_pretrained(str(tmp), safe_serialization=True)
    save_tokenizer(tokenizer, tmp, "Qwen2Tokenizer")
    _replace_dir(tmp, target)


def save_prm(prm, tokenizer, target: Path) -> None:
    from safetensors.torch import save_file

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".prm-", dir=target.parent))
    cfg = prm.config.to_dict()
    cfg["architectures"] = ["Qwen2ForProcessRewardModel"]
    cfg["tie_word_embeddings"] = False  # a reward model: no LM head at all
    cfg["num_labels"] = 2
    cfg.setdefault("torch_dtype", "float32")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    save_file(prm.checkpoint_state(), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    save_tokenizer(tokenizer, tmp, "Qwen2Tokenizer")
    _replace_dir(tmp, target)
