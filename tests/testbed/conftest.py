"""Fixtures for the testbed tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Small models: extra threads only stall on a busy machine (as in tests/engine/torch)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
