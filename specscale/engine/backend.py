"""The Backend protocol: what the scheduler needs from an engine.

The Server never reads a clock: every call returns the seconds it took (measured on
the torch backend, modelled on the simulator).

``forward`` may return its seconds still pending on the device (the torch backend on
CUDA: a ``DeviceInterval``, see specscale/engine/torch/runtime/device_timer.py), so that the
forward itself never waits for the device; the generation engine turns them into a
float with ``resolve_seconds`` once it has read the drawn tokens back (that read is the
iteration's one synchronisation). ``score`` returns a float: its own read of the
rewards is its one synchronisation. After ``GenerationEngine.step`` and ``score``
return, the device work they queued has finished, which is what the wall clock relies
on (specscale/clock.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence, Union

import torch

from specscale.clock import VirtualClock
from specscale.engine.sequence import PhysicalSequence


class PendingSeconds(Protocol):
    """A duration the device has not necessarily finished measuring."""

    def resolve(self) -> float:
        """The seconds, waiting for the device only if it has not finished the call."""
        ...


Seconds = Union[float, PendingSeconds]


def resolve_seconds(seconds: Seconds) -> float:
    """A backend's seconds as a float: floats (the sim, vLLM, the CPU) pass unchanged."""
    if isinstance(seconds, float):
        return seconds
    if isinstance(seconds, int):
        return float(seconds)
    return seconds.resolve()


@dataclass(slots=True)  # one per row per iteration: slots make it cheap to build and read
class GenRow:
    """One physical sequence in a generation iteration."""

    seq: PhysicalSequence
    start: int  # tokens already cached
    n_new: int  # tokens computed this iteration (1 = decode)
    wants_logits: bool  # the chunk reaches the end of the history and members will draw
    speculative: bool = False  # every member is ahead of an unresolved selection


@dataclass
class GenBatch:
    rows: list[GenRow]
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst)


@dataclass
class ScoreItem:
    """One PRM task: the path of `candidate` (steps from round 0).

    n_cached prefix tokens are read from the PRM's KV cache (the prefix of
    `cached_from`, an ancestor or the request's root); n_new tokens are computed: the
    pieces of the steps after that prefix and the path's closing tokens. block_table
    (PRM KV blocks covering n_cached + n_new positions) is None when the task runs
    without the cache; block_copies are copy-on-write copies to do before it runs.
    Planned by ``PRMCache`` (specscale/engine/prm_cache.py), the same for every backend.

    A ``prefix_only`` item computes a request's head (candidate = the root) into the
    cache and gives no rewards: the *head wave*, run before the batch's other items
    so that the tasks sharing a head not yet cached read it instead of each
    recomputing it. Backends run the waves of ``score_waves`` in order.
    """

    candidate: Any
    n_new: int
    n_cached: int
    block_table: Optional[list[int]] = None
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    cached_from: Any = None
    prefix_only: bool = False


def score_waves(items: Sequence[ScoreItem]) -> list[list[ScoreItem]]:
    """The PRM forwards a batch needs, in order: the head wave (if any), then the tasks.
    Tasks read the head's KV and copy its partial last block, so it must be written
    first (a copy-on-write before the same forward would copy it unwritten)."""
    heads = [it for it in items if it.prefix_only]
    rest = [it for it in items if not it.prefix_only]
    return [w for w in (heads, rest) if w]


class Backend(Protocol):
    vocab_size: int
    eos_ids: frozenset[int]
    delimiter_ids: frozenset[int]

    def prompt_tokens(self, request: Any) -> list[int]: ...

    def forward(self, batch: GenBatch) -> tuple[torch.Tensor, Seconds]:
        """Logits [rows wanting logits, vocab] in row order, and seconds taken (a float, or
        pending on the device: the caller resolves them with ``resolve_seconds`` after its
        first read of the logits' results)."""
        ...

    def score(self, items: Sequence[ScoreItem]) -> tuple[list[list[float]], float]:
        """Per-step rewards of each item's whole path, and seconds taken (a float; the
        device work of the call has finished when it returns)."""
        ...

    def prm_path_tokens(self, candidate: Any) -> int:
        """PRM prefix tokens of a candidate's path: the format head with the question, then
        each step's piece (its tokens and separator / turn tokens). For the root (round -1):
        the head alone. The path's closing tokens are not included."""
        ...

    prm_closing_tokens: int  # tokens that complete a path's PRM input after its prefix

    def make_clock(self) -> Any:
        """The clock the Server runs on (specscale/clock.py): wall or virtual."""
        ...

    def answer(self, candidate: Any) -> Any: ...

    def equivalent(self, a: Any, b: Any) -> bool: ...

    def kv_blocks(self, block_size: int) -> int: ...

    def bytes_per_block(self, block_size: int) -> int: ...


class GenerationSide(Protocol):
    """The generation side the Server drives: placement of logical members on physical
    sequences, one iteration per ``step``, KV accounting. Two implementations:
    ``GenerationEngine`` (generation.py: the harness's own scheduler, paged KV accounting
    and paired sampler, over a backend's ``forward``; sim and torch) and ``VLLMGeneration``
    (vllm/generation.py: vLLM's scheduler and KV, one vLLM request per step). Both return
    the same ``StepResult`` (generation.py)."""

    blocks: Any  # the KV pool the recorder reads (a BlockManager, or a view of vLLM's pool)
    total_preemptions: int
    prefix_hit_tokens: int
    recomputed_prefill_tokens: int

    def add_prompt(self, request_id: int, admit_order: int, prompt: list[int]) -> Any: ...

    def start_children(self, parent: Any, children: list[Any], now: float) -> None: ...

    def remove_member(self, c: Any) -> None: ...

    def has_work(self) -> bool: ...

    def step(self) -> Any: ...

    def kv_errors(self) -> list[str]: ...

    def running_logical(self) -> int: ...

    def live_sequences(self) -> int: ...


class BackendBase:
    """What a backend may leave out, with the meaning of leaving it out. Every backend
    (sim, torch, vLLM, and the tests' stubs) inherits it, so the Server and ``run_cell``
    read these attributes directly instead of probing for them."""

    max_model_len: Optional[int] = None  # the generator's context window; None = no window
    prm_closing_tokens: int = 0  # tokens that complete a path's PRM input after its prefix
    # Adaptive verification's PRM cost curve (specscale/verify/prm_curve.py): a callable over
    # (new, cached) tasks and over (count, new, cached) groups, and timed batches to start from.
    prm_cost: Optional[Callable[[Sequence[tuple[float, float]]], float]] = None
    prm_cost_groups: Optional[Callable[[Sequence[tuple[int, float, float]]], float]] = None
    prm_profile: Sequence[tuple[int, float]] = ()
    runner: Any = None  # a model runner (torch, vLLM): warm-up seconds, memory plan, device
    device: Any = None  # the device computed on, when the backend knows it without a runner
    engine_features: Optional[dict[str, Any]] = None  # None = the harness's full feature set

    def make_clock(self) -> Any:
        """The clock the Server runs on (specscale/clock.py): a virtual clock advanced by
        the seconds each call reports, unless the backend measures a wall clock."""
        return VirtualClock()

    def attention_paths(self) -> Optional[dict[str, Any]]:
        """The attention path each model served with, for provenance ({"generator": ...,
        "prm": ...}); None for engines without that choice (sim, vLLM)."""
        return None

    def summary_extras(self) -> dict[str, Any]:
        """The engine's own accounting, added to the cell's summary."""
        return {}
