"""Fixtures for the torch backend tests: the tiny model set and transformers references."""

from __future__ import annotations

import random

import pytest
import torch

from specscale.testbed.tiny_models import ensure_tiny_models

TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Fresh build per session (also exercises the builder); ~1 s."""
    return ensure_tiny_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def hf_causal_lm(tiny):
    """(name, dtype) -> transformers AutoModelForCausalLM on the same local checkpoint (cached)."""
    from transformers import AutoModelForCausalLM

    cache = {}

    def get(name: str, dtype: torch.dtype):
        if (name, dtype) not in cache:
            model, info = AutoModelForCausalLM.from_pretrained(
                str(tiny[name]), dtype=dtype, attn_implementation="sdpa", output_loading_info=True
            )
            # The reference must really hold the checkpoint's weights, not random fill-ins.
            assert not info["missing_keys"] and not info["unexpected_keys"], info
            cache[name, dtype] = model.eval()
        return cache[name, dtype]

    return get


@pytest.fixture(scope="session")
def ref_logits(hf_causal_lm):
    """(name, dtype, token ids) -> transformers logits at every position [L, vocab]."""

    def run(name: str, dtype: torch.dtype, ids) -> torch.Tensor:
        with torch.no_grad():
            return hf_causal_lm(name, dtype)(torch.tensor([list(ids)])).logits[0]

    return run


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours.to(ref.dtype) - ref).abs().max() / ref.abs().max()).item()


@pytest.fixture
def assert_close_rel():
    def check(ours, ref, dtype, what=""):
        err = rel_err(ours, ref)
        assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.3e} > {TOLERANCE[dtype]:.0e}"

    return check


class BlockPool:
    """Stand-in for the block manager: hands out block ids in a scrambled order
    so addressing bugs cannot hide behind contiguous tables."""

    def __init__(self, num_blocks: int, seed: int = 0):
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def take(self) -> int:
        return self.free.pop()

    def grow(self, table: list[int], tokens: int, block_size: int) -> list[int]:
        while len(table) * block_size < tokens:
            table.append(self.take())
        return table


@pytest.fixture
def block_pool():
    return BlockPool
