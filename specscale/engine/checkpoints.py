"""Where a model's checkpoint is: ``model.<role>.hf_name`` -> a local directory.

Shared by every engine that loads real checkpoints (torch, vLLM). Besides local paths and
the local Hugging Face cache (never a download), two prefixes name checkpoints this
project makes: ``tiny/<name>`` (random weights of the real architectures, built on first
use: specscale/testbed/tiny_models.py) and ``testbed/<name>`` (the trained testbed pair).
"""
from __future__ import annotations

from pathlib import Path

from specscale.settings.search_policy import ConfigError

TINY_PREFIX = "tiny/"
TESTBED_PREFIX = "testbed/"


def resolve_checkpoint(hf_name: str, role: str) -> Path:
    """``model.<role>.hf_name`` -> a local checkpoint directory."""
    key = f"model.{role}.hf_name"
    if not hf_name:
        raise ConfigError(f"{key} is empty")
    hf_name = str(hf_name)
    if hf_name.startswith(TINY_PREFIX):
        from specscale.testbed.tiny_models import ensure_tiny_models

        paths = ensure_tiny_models()
        name = hf_name[len(TINY_PREFIX):]
        if name not in paths:
            choices = sorted(TINY_PREFIX + n for n in paths)
            raise ConfigError(f"{key}={hf_name!r}: no such tiny model; choose one of {choices}")
        return paths[name]
    if hf_name.startswith(TESTBED_PREFIX):
        from specscale.testbed import CHECKPOINTS, checkpoint_dir

        name = hf_name[len(TESTBED_PREFIX):]
        if name not in CHECKPOINTS:
            raise ConfigError(f"{key}={hf_name!r}: no such testbed model; choose one of "
                              f"{sorted(TESTBED_PREFIX + n for n in CHECKPOINTS)}")
        path = checkpoint_dir(name)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{key}={hf_name!r}: the testbed weights are missing from {path}; "
                                    "train them with: python -m runners.train_testbed")
        return path
    path = Path(hf_name).expanduser()
    if path.is_dir():
        return path
    looks_like_path = hf_name.startswith(("/", ".", "~")) or hf_name.count("/") != 1
    if looks_like_path:
        raise FileNotFoundError(f"{key}={hf_name!r}: checkpoint directory not found: {path}")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(hf_name, local_files_only=True))
    except Exception as exc:  # LocalEntryNotFoundError, offline errors, ...
        raise FileNotFoundError(
            f"{key}={hf_name!r}: the model is not in the local Hugging Face cache and this harness never "
            f"downloads; fetch it beforehand (huggingface-cli download {hf_name}) or set {key} to a local "
            f"checkpoint directory ({type(exc).__name__}: {exc})"
        ) from None
