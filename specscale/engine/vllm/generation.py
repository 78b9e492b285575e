"""The generation side on vLLM: one vLLM request per candidate step.

The Server drives this object exactly as it drives ``GenerationEngine``
(``add_prompt``, ``start_children``, ``remove_member``, ``has_work``, ``step`` returning
a ``StepResult``); the search never sees the difference.

* A child's request: prompt = its parent's whole history (prompt + path) as token ids,
  ``stop_token_ids`` = the step delimiter and EOS ids, ``max_tokens`` = what the step
  cap, the path cap and the window leave, and its own ``seed`` derived from the
  child's lineage key (``request_seed``). vLLM draws a request's tokens from a
  generator seeded by that seed and advanced per token, so the same member draws the
  same tokens whatever else is in the batch or when it runs (docs/design.md §4 on vLLM). Every
  request carries its own seed: on CPU one unseeded request in a batch makes vLLM
  ignore the others' seeds (vLLM #51226), and one seeded SamplingParams shared by a
  batch gives every prompt the same noise (#50440).
* Speculative children are submitted as soon as the search starts them (when their
  parent's step ends); cancellation aborts the request and vLLM frees its KV.
* Prefix sharing is vLLM's automatic prefix caching: a finished step's blocks stay
  cached (evictable) and its children's prompts re-find them. There is no token-level
  merging of identical concurrent draws (CD): each member is its own request.
* The prompt itself is not prefilled on its own: the first round's requests prefill it
  and share it through the prefix cache.
* Why a step ended is decided from its tokens with the same rule, in the same order,
  as ``GenerationEngine`` (EOS, path cap / window, delimiter, step cap).
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from specscale.engine.generation import KVCapacityError, StepResult
from specscale.hashing import combine, mix64, roll
from specscale.engine.sequence import history_hash
from specscale.engine.vllm.features import GenIteration
from specscale.engine.vllm.probe import SchedulerProbe, VLLMBlocks
from specscale.search.candidate import Candidate, Status, step_end_reason

logger = logging.getLogger(__name__)

_SEED_SALT = 0x5EED_0F_C0DE


def request_seed(key: int) -> int:
    """vLLM seed of a member's step, from its lineage key (63 bits: a valid int64)."""
    return mix64(combine(key, _SEED_SALT)) >> 1


@dataclass(eq=False)
class VLLMSequence:
    """A token history: the prompt (root) or a member's path after its step."""

    sid: int
    request_id: int  # the Server's request
    tokens: list[int]
    hist_hash: int
    members: list[Any] = field(default_factory=list)  # the one candidate running its step here
    holders: int = 0
    vllm_id: Optional[str] = None  # the in-flight vLLM request
    freed: bool = False
    num_cached_tokens: int = 0  # prompt tokens vLLM found in its prefix cache
    # Tokens of the running step seen so far: requests report only when they finish
    # (FINAL_ONLY), so this stays 0 while a step runs (readers such as adaptive
    # verification's KV estimate then count no blocks for an unfinished step on vLLM).
    step_pos: int = 0

    # The Server starts a request's search once its prompt is "cached"; on vLLM the
    # first round's requests prefill it, so a prompt is ready at once.
    @property
    def num_cached(self) -> int:
        return len(self.tokens)

    @property
    def target_cached(self) -> int:
        return len(self.tokens)


class VLLMGeneration:
    def __init__(self, llm, probe: SchedulerProbe, sampling, limits, step_token_cap: int, path_token_cap: int,
                 max_model_len: int, eos_ids: frozenset[int], delimiter_ids: frozenset[int]) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._params = VSamplingParams
        self._final = RequestOutputKind.FINAL_ONLY
        self.llm = llm
        self.sampling = sampling
        self.limits = limits
        self.step_token_cap = step_token_cap
        self.path_token_cap = path_token_cap
        self.max_len = max_model_len
        self.eos_ids, self.delimiter_ids = eos_ids, delimiter_ids
        self._stop = sorted(eos_ids | delimiter_ids)
        self.probe = probe  # one per vLLM engine, shared by the cells it serves
        self.total_preemptions = 0  # this cell's
        self.blocks = VLLMBlocks(llm, limits.block_size)
        self.seqs: dict[int, VLLMSequence] = {}
        self._inflight: dict[str, VLLMSequence] = {}  # our request id -> sequence generating there
        self._external: dict[str, str] = {}  # vLLM's internal request id (what its scheduler sees) -> ours
        self._sid = itertools.count()
        self._rid = itertools.count()
        self.prefix_hit_tokens = 0  # prompt tokens of step requests read from vLLM's prefix cache
        self.prompt_tokens_computed = 0  # prompt tokens of step requests vLLM computed
        self.recomputed_prefill_tokens = 0  # tokens scheduled again for requests resumed after preemption
        self.aborted_requests = 0
        self.submitted_requests = 0
        # One per step(), in the order the recorder records generation iterations: what
        # vLLM scheduled, as the profiled cost model's features (engine.vllm.replay).
        self.iteration_features: list[GenIteration] = []

    # ------------------------------------------------------------------ placement
    def add_prompt(self, request_id: int, admit_order: int, prompt: list[int]) -> VLLMSequence:
        if not prompt:
            raise ValueError(f"request {request_id}: empty prompt")
        seq = VLLMSequence(next(self._sid), request_id, list(prompt), history_hash(prompt))
        self.seqs[seq.sid] = seq
        return seq

    def start_children(self, parent: Candidate, children: list[Candidate], now: float) -> None:
        src: VLLMSequence = parent.phys
        if src is None or src.freed:
            raise RuntimeError(f"candidate {parent.cid}: children started after its history was released")
        for child in children:
            seq = VLLMSequence(next(self._sid), src.request_id, list(src.tokens), src.hist_hash)
            self.seqs[seq.sid] = seq
            child.phys = seq
            child.step_start = len(src.tokens)
            child.status = Status.RUNNING
            child.start_time = now
            seq.members.append(child)
            self._submit(seq, child)

    def _submit(self, seq: VLLMSequence, c: Candidate) -> None:
        room = min(self.step_token_cap, self.path_token_cap - c.path_tokens_before, self.max_len - len(seq.tokens))
        if room < 1:
            raise RuntimeError(f"candidate {c.cid}: no room for a step (its path or window is full)")
        greedy = self.sampling.temperature == 0.0
        params = self._params(
            n=1, temperature=self.sampling.temperature, top_p=1.0 if greedy else self.sampling.top_p,
            seed=None if greedy else request_seed(c.key), max_tokens=room, stop_token_ids=self._stop,
            ignore_eos=False, detokenize=False, output_kind=self._final,
        )
        rid = f"s{next(self._rid)}"
        internal = self.llm.add_request(rid, {"prompt_token_ids": seq.tokens}, params)
        seq.vllm_id = rid
        self._inflight[rid] = seq
        self._external[internal] = rid
        self.submitted_requests += 1

    def remove_member(self, c: Candidate) -> None:
        seq: VLLMSequence = c.phys
        if seq is None:
            return
        if c.status is Status.RUNNING and c in seq.members:
            seq.members.remove(c)
            if seq.vllm_id in self._inflight:  # still generating: abort frees its KV in vLLM
                del self._inflight[seq.vllm_id]
                self.llm.abort_request([seq.vllm_id])
                self.aborted_requests += 1
        if c.holds_kv:
            c.holds_kv = False
            seq.holders -= 1
        self._maybe_free(seq)

    def _maybe_free(self, seq: VLLMSequence) -> None:
        if seq.freed or seq.members or seq.holders > 0:
            return
        seq.freed = True
        del self.seqs[seq.sid]

    # ------------------------------------------------------------------ one iteration
    def has_work(self) -> bool:
        return bool(self._inflight)

    def step(self) -> StepResult:
        t0 = time.perf_counter()
        outputs = self.llm.step()
        seconds = time.perf_counter() - t0
        it = self.probe.take()
        if not it.total_tokens and not outputs and self._inflight:
            raise KVCapacityError(
                f"vLLM scheduled nothing with {len(self._inflight)} requests waiting: its KV pool of "
                f"{self.blocks.num_blocks} blocks cannot hold them (raise engine.kv_blocks or the memory share)"
            )
        self.blocks.observe(it.kv_used_blocks)
        self.total_preemptions += it.preempted
        result = StepResult(seconds=seconds, decode_rows=0, prefill_tokens=0, logit_rows=0, draws=0,
                            speculative_rows=0, forks=0, preempted=it.preempted, rows=len(it.scheduled))
        feats = GenIteration()
        self.iteration_features.append(feats)
        for vid, n in it.scheduled.items():
            seq = self._inflight.get(self._external.get(vid, ""))
            if vid in it.resumed:
                self.recomputed_prefill_tokens += n
            # No chunked prefill: a request is prefilled whole when it is new or resumed
            # after a preemption, and decodes one token per iteration otherwise.
            done = it.computed.get(vid, 0)
            if vid in it.new or vid in it.resumed:
                result.prefill_tokens += n
                feats.prefill.append((n, done))
            else:
                result.decode_rows += 1
                feats.decode_ctx.append(done + n)  # the new token attends to the computed ones and itself
            # Without chunked prefill every scheduled request samples one token.
            result.logit_rows += 1
            if seq is not None and seq.members and seq.members[0].position is None:
                result.speculative_rows += 1
        result.draws = feats.logit_rows = result.logit_rows
        for out in outputs:
            if not out.finished:
                continue
            seq = self._inflight.pop(out.request_id, None)
            if seq is None:
                continue  # aborted after it finished inside vLLM
            self._finish(seq, out, result)
        if any(o.finished for o in outputs):
            live = set(self._inflight)
            self._external = {k: v for k, v in self._external.items() if v in live}
        return result

    def _finish(self, seq: VLLMSequence, out, result: StepResult) -> None:
        completion = out.outputs[0]
        step = list(completion.token_ids)
        c: Candidate = seq.members[0]
        hist_len = len(seq.tokens)
        seq.num_cached_tokens = int(out.num_cached_tokens or 0)
        self.prefix_hit_tokens += seq.num_cached_tokens
        self.prompt_tokens_computed += hist_len - seq.num_cached_tokens
        if not step:
            raise RuntimeError(f"vLLM finished candidate {c.cid}'s step with no tokens ({completion.finish_reason})")
        h = seq.hist_hash
        for t in step:
            h = roll(h, t)
        seq.hist_hash = h
        seq.tokens.extend(step)
        last, n = step[-1], len(step)
        reason = step_end_reason(last, self.eos_ids, self.delimiter_ids, c.path_tokens_before + n,
                                 self.path_token_cap, len(seq.tokens), self.max_len, n, self.step_token_cap)
        if reason is None:
            raise RuntimeError(
                f"vLLM ended candidate {c.cid}'s step for a reason the search does not know: "
                f"{completion.finish_reason} after {n} tokens (last token {last})"
            )
        c.step_tokens = step
        c.end_reason = reason
        c.end_hash = h
        c.status = Status.DONE
        c.holds_kv = True
        seq.holders += 1
        seq.members = []
        seq.vllm_id = None
        result.finished.append((seq, [c]))

    # ------------------------------------------------------------------ accounting
    def kv_errors(self) -> list[str]:
        """Bookkeeping invariants: every running member has an in-flight request, every
        in-flight request a running member; no live sequence that nobody needs."""
        errors = []
        for vid, seq in self._inflight.items():
            if not seq.members or seq.members[0].status is not Status.RUNNING:
                errors.append(f"vLLM request {vid} is in flight without a running member")
        for seq in self.seqs.values():
            if not (seq.members or seq.holders > 0):
                errors.append(f"sequence {seq.sid} is alive but nobody needs it")
            if seq.members and seq.vllm_id not in self._inflight:
                errors.append(f"sequence {seq.sid} runs candidate {seq.members[0].cid} without a vLLM request")
        return errors

    def running_logical(self) -> int:
        return len(self._inflight)

    def live_sequences(self) -> int:
        return len(self.seqs)

    def vllm_unfinished(self) -> int:
        return self.llm.get_num_unfinished_requests()
