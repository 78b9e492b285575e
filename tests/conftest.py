"""Fixtures shared by every test directory."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models' ops are too small to split: extra threads only add sync cost (and stall
    on a busy machine). Modules opt in with pytestmark = usefixtures("one_thread")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
