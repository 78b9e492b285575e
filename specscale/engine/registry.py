"""The engines a cell can run on: ``engine.name`` -> the function that builds its backend
and the problems it serves from the cell spec.

Each builder imports its heavy libraries (transformers, vLLM) only when it runs, so the
registry itself is cheap to import. The names are the settings' ``ENGINE_NAMES`` (a test
checks the two agree): the settings validate ``engine=NAME`` without importing engines.
"""
from __future__ import annotations

from typing import Any, Callable

from specscale.engine.profile_speed import build_sim_checked
from specscale.engine.torch.build import build_torch
from specscale.engine.vllm.build import build_vllm
from specscale.settings import CellSpec

Builder = Callable[[CellSpec], tuple[Any, list]]  # (backend, problems)

ENGINES: dict[str, Builder] = {"sim": build_sim_checked, "torch": build_torch, "vllm": build_vllm}


def build_backend(spec: CellSpec) -> tuple[Any, list]:
    """The backend and problems of ``spec``'s engine (validated by the spec: a known name)."""
    return ENGINES[spec.engine.name](spec)
