"""TorchBackend, one call at a time: logits through GenBatch (prefill, fork with
copy-on-write, decode) equal transformers'; the context-window stop; token sets;
PRM scoring of candidate paths; answers; memory accounting."""

from __future__ import annotations

import pytest
import torch

from specscale.engine.backend import GenBatch, GenRow, ScoreItem
from specscale.engine.block_manager import BlockManager
from specscale.engine.sequence import PhysicalSequence, history_hash
from specscale.engine.torch.backend import TorchBackend
from specscale.engine.torch.attention.kv_cache import PagedKVCache
from specscale.engine.torch.runtime.model_runner import ModelRunner
from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.text.tokenizer import load_tokenizer
from specscale.search.candidate import END_DELIMITER, END_EOS, Candidate, Status

BS = 8


@pytest.fixture(scope="module")
def backends(tiny):
    cache = {}

    def get(name="qwen2", dtype=torch.float64, num_blocks=64):
        key = (name, dtype, num_blocks)
        if key not in cache:
            prm_name = "qwen2_prm" if name == "qwen2" else "llama_prm"
            runner = ModelRunner(tiny[name], num_blocks=num_blocks, block_size=BS, dtype=dtype)
            prm = ProcessRewardModel(tiny[prm_name], dtype=dtype)
            cache[key] = TorchBackend(runner, prm, load_tokenizer(tiny[name]), {})
        return cache[key]

    return get


def seq_of(tokens, sid=0) -> PhysicalSequence:
    return PhysicalSequence(sid=sid, request_id=0, admit_order=0, tokens=list(tokens), hist_hash=history_hash(tokens))


def run_rows(backend, blocks: BlockManager, seqs_and_new):
    """One GenBatch: each (seq, n_new) computes its next n_new tokens; as the engine does it."""
    rows, copies = [], []
    for seq, n_new in seqs_and_new:
        copies.extend(blocks.append(seq.blocks, seq.num_cached, n_new))
        end = seq.num_cached + n_new
        rows.append(GenRow(seq, seq.num_cached, n_new, wants_logits=end == len(seq.tokens)))
    logits, seconds = backend.forward(GenBatch(rows, copies))
    for seq, n_new in seqs_and_new:
        seq.num_cached += n_new
    assert seconds > 0
    return logits, copies


@pytest.mark.parametrize("name", ["qwen2", "llama"])
def test_logits_after_fork_with_copy_on_write_equal_transformers(name, backends, ref_logits, assert_close_rel):
    """Prefill a prompt root, fork two children off its partial last block (copy-on-write
    happens through GenBatch.block_copies), decode diverging tokens; every logits row
    equals transformers' on the full history."""
    dtype = torch.float64
    backend = backends(name, dtype)
    blocks = BlockManager(backend.kv_blocks(BS), BS)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 400, (21,), generator=g).tolist()  # 2 full blocks + 5 tokens
    root = seq_of(prompt)
    logits, _ = run_rows(backend, blocks, [(root, len(prompt))])
    assert logits.shape == (1, backend.vocab_size) and logits.dtype == torch.float64
    assert_close_rel(logits[0], ref_logits(name, dtype, prompt)[-1], dtype, "prompt")

    tails = [torch.randint(0, 400, (6,), generator=g).tolist() for _ in range(2)]
    children = []
    for i, tail in enumerate(tails):
        child = seq_of(prompt + tail[:1], sid=i + 1)
        child.blocks = blocks.fork(root.blocks, root.num_cached)
        child.num_cached = root.num_cached
        children.append(child)
    blocks.free(root.blocks)  # the root is released; its blocks live on in the children
    refs = [ref_logits(name, dtype, prompt + t) for t in tails]
    saw_copy = False
    for step in range(len(tails[0])):
        logits, copies = run_rows(backend, blocks, [(c, 1) for c in children])
        saw_copy |= bool(copies)
        for i, c in enumerate(children):
            assert_close_rel(logits[i], refs[i][len(prompt) + step], dtype, f"child {i} step {step}")
            if step + 1 < len(tails[i]):
                c.tokens.append(tails[i][step + 1])
    assert saw_copy, "the shared partial block was never copied"
    for c in children:
        blocks.free(c.blocks)
    assert blocks.num_free == blocks.num_blocks


def test_rows_without_logits_and_order(backends, ref_logits, assert_close_rel):
    """A prefill chunk that stops short of the history's end computes no logits row;
    logits rows come back in row order."""
    dtype = torch.float64
    backend = backends("qwen2", dtype)
    blocks = BlockManager(backend.kv_blocks(BS), BS)
    a, b = seq_of(list(range(30, 60))), seq_of(list(range(100, 117)), sid=1)
    logits, _ = run_rows(backend, blocks, [(a, 20), (b, 17)])  # a: chunk of 20 of 30 tokens
    assert logits.shape[0] == 1
    assert_close_rel(logits[0], ref_logits("qwen2", dtype, b.tokens)[-1], dtype, "row b")
    logits, _ = run_rows(backend, blocks, [(a, 10)])
    assert_close_rel(logits[0], ref_logits("qwen2", dtype, a.tokens)[-1], dtype, "row a, second chunk")
    c = seq_of([1, 2, 3], sid=5)
    blocks.append(c.blocks, 0, 2)
    empty, _ = backend.forward(GenBatch([GenRow(c, 0, 2, False)], []))
    assert empty.shape == (0, backend.vocab_size)


def test_recompute_after_preemption_gives_the_same_logits(backends):
    """Preemption drops the KV; the history is prefilled again from start 0 into fresh blocks."""
    backend = backends("qwen2", torch.float64)
    blocks = BlockManager(backend.kv_blocks(BS), BS)
    seq = seq_of(list(range(40, 75)))
    first, _ = run_rows(backend, blocks, [(seq, len(seq.tokens))])
    blocks.free(seq.blocks)
    seq.num_cached = 0
    blocks.append([], 0, 24)  # the old blocks are reused by someone else
    again, _ = run_rows(backend, blocks, [(seq, len(seq.tokens))])
    assert (first - again).abs().max().item() <= 1e-12


def test_token_sets(backends):
    backend = backends("qwen2", torch.float32)
    tok = backend.tokenizer
    assert tok.convert_tokens_to_ids("<|im_end|>") in backend.eos_ids
    assert backend.delimiter_ids and not (backend.delimiter_ids & backend.eos_ids)
    for t in backend.delimiter_ids:
        assert "\n\n" in tok.decode([t])
    llama = backends("llama", torch.float32)
    assert llama.tokenizer.convert_tokens_to_ids("<|eot_id|>") in llama.eos_ids


def _candidate(backend, parent, cid, text, reason=END_DELIMITER, round_=None):
    ids = backend.tokenizer.encode(text, add_special_tokens=False)
    return Candidate(
        cid=cid, key=cid, request_id=0, round=0 if parent is None else parent.round + 1, child_index=0, parent=parent,
        path_tokens_before=0 if parent is None else parent.path_tokens, status=Status.DONE, step_tokens=ids,
        end_reason=reason,
    )


def test_score_and_answer_of_a_path(backends):
    """Steps are decoded, the delimiter dropped, scored in one PRM batch as the PRM format says."""
    from specscale.data.problem import Problem

    backend = backends("qwen2", torch.float64)
    question = "What is 12 + 5?"
    backend.problems = {0: Problem("p0", question, "17", "fixture")}
    s0 = _candidate(backend, None, 1, "Step 1: We add 12 and 5.\n\n")
    s1 = _candidate(backend, s0, 2, "The answer is \\boxed{17}.<|im_end|>", END_EOS)
    other = _candidate(backend, None, 3, "Multiply 12 by 5.<extra_0> x\n\n")  # separator text is removed
    n = backend.prm_path_tokens(s1)  # the prefix; the closing tokens come after it in every input
    steps = ["Step 1: We add 12 and 5.", "The answer is \\boxed{17}."]
    assert n + backend.prm_closing_tokens == len(backend.prm.format.encode(question, steps).token_ids)
    full = lambda c: ScoreItem(c, backend.prm_path_tokens(c) + backend.prm_closing_tokens, 0)  # noqa: E731
    items = [full(c) for c in (s1, other, s0)]
    rewards, seconds = backend.score(items)
    assert seconds > 0 and [len(r) for r in rewards] == [2, 1, 1]
    expect = backend.prm.score_paths(question, [["Step 1: We add 12 and 5.", "The answer is \\boxed{17}."],
                                                 ["Multiply 12 by 5. x"], ["Step 1: We add 12 and 5."]])
    # The generated ids go to the PRM as they are (same vocabulary), less the separator token:
    # "5." + " x" here, not the re-tokenized text "5. x".
    fmt = backend.prm.format
    expect[1] = backend.prm.score_token_ids([fmt.encode_pieces(question, [backend._prm_content(other)])])[0]
    assert 0 < abs(expect[1][0] - backend.prm.score_paths(question, [["Multiply 12 by 5. x"]])[0][0])
    for got, want in zip(rewards, expect):
        assert got == pytest.approx(want, abs=1e-12)
    assert rewards[0][0] == rewards[2][0]  # the same prefix path, the same reward, in any batch
    assert backend.answer(s1) == "17" and backend.answer(s0) is None
    assert backend.equivalent("17", "17.0") and not backend.equivalent(None, "17")


def test_identical_inputs_get_identical_rewards(backends):
    from specscale.data.problem import Problem

    backend = backends("qwen2", torch.float64)
    backend.problems = {0: Problem("p0", "What is 2 + 2?", "4", "fixture")}
    a = _candidate(backend, None, 10, "Add two and two.\n\n")
    b = _candidate(backend, None, 11, "Add two and two.\n\n")
    c = _candidate(backend, None, 12, "Something else entirely.\n\n")
    full = lambda x: ScoreItem(x, backend.prm_path_tokens(x) + backend.prm_closing_tokens, 0)  # noqa: E731
    r1, _ = backend.score([full(a), full(c)])
    r2, _ = backend.score([full(c), full(b), full(c)])
    assert r1[0] == r2[1] and r1[1] == r2[0] == r2[2]


def test_memory_accounting(backends):
    backend = backends("qwen2", torch.float32, num_blocks=48)
    assert backend.kv_blocks(BS) == 48 == backend.runner.kv_cache.num_blocks
    cfg = backend.runner.config
    assert backend.bytes_per_block(BS) == PagedKVCache.bytes_per_block(cfg, BS, torch.float32)
    assert backend.bytes_per_block(BS) == 2 * cfg.num_hidden_layers * BS * cfg.num_key_value_heads * cfg.head_dim * 4
    with pytest.raises(ValueError, match="blocks of 8 tokens"):
        backend.kv_blocks(16)
