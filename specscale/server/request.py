"""A request as the Server sees it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class Request:
    request_id: int
    problem: Any  # the dataset record (id, reference answer, ...)
    arrival: float
    prompt: Optional[list[int]] = None
    admit_time: Optional[float] = None
    finish_time: Optional[float] = None
    search: Any = None
