"""Fixtures shared by every test directory."""
from __future__ import annotations

import os

import pytest
import torch

# The engines' per-token and per-block checks (engine.debug_checks: off when serving) run
# in every test, so a bad batch fails loudly where it is built.
os.environ.setdefault("SPECSCALE_DEBUG_CHECKS", "1")


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models' ops are too small to split: extra threads only add sync cost (and stall
    on a busy machine). Modules opt in with pytestmark = usefixtures("one_thread")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
