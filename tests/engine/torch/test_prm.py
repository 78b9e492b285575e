"""PRM step rewards equal references computed with transformers, following the
released models' own usage code (one path at a time, head applied by hand)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from specscale.engine.torch.prm.model import ProcessRewardModel
from specscale.engine.torch.prm.batch import pack
from specscale.engine.text.prm_format import PRMInput

QUESTION = "Alice has 12 apples. Bob gives Alice 5 more apples. How many apples does Alice have now?"
PATHS = [
    ["Step 1: We add 12 and 5 to get 12 + 5 = 17.", "The answer is \\boxed{17}."],
    ["Step 1: Subtract 5 from 12, so 12 - 5 = 7.", "Therefore the total is 7.", "The answer is \\boxed{7}."],
    ["Multiply 12 by 5: 12 * 5 = 60."],
    [],  # no steps yet: no rewards, no forward
    ["Let x = 12. Then 2x + 5 = 29, so the value is 29.", "x^2 - 5x + 12 = 0 has two roots.", "+ - 3", ""],
]
DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.float64, id="float64")]
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def qwen_reference(model_dir, dtype, question, steps_per_path):
    """Qwen2.5-Math-PRM model-card recipe with transformers' Qwen2Model + hand-made head."""
    from transformers import AutoTokenizer, Qwen2Model

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    body = Qwen2Model.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa").eval()
    w = {k: v.to(dtype) for k, v in load_file(str(model_dir / "model.safetensors")).items() if k.startswith("score.")}
    sep = tok.encode("<extra_0>")[0]
    out = []
    for steps in steps_per_path:
        if not steps:
            out.append([])
            continue
        messages = [
            {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"},
        ]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        ids = torch.tensor([tok.encode(text)])
        with torch.no_grad():
            h = body(input_ids=ids).last_hidden_state[0]
        h = h[ids[0] == sep]
        h = torch.relu(h @ w["score.0.weight"].T + w["score.0.bias"])
        logits = h @ w["score.2.weight"].T + w["score.2.bias"]
        out.append(logits.softmax(-1)[:, 1].tolist())
    return out


def rlhflow_reference(model_dir, dtype, question, steps_per_path):
    """RLHFlow Llama3.1-8B-PRM usage code: re-run the growing conversation per step,
    read logits[-3] at the '+' / '-' tokens."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=dtype, attn_implementation="sdpa").eval()
    candidates = [tok.encode("+")[-1], tok.encode("-")[-1]]
    out = []
    for steps in steps_per_path:
        conversation, rewards = [], []
        for k, step in enumerate(steps):
            conversation.append({"role": "user", "content": question + " " + step if k == 0 else step})
            conversation.append({"role": "assistant", "content": "+"})
            enc = tok.apply_chat_template(conversation, return_tensors="pt", return_dict=True)
            with torch.no_grad():
                logits = model(enc["input_ids"]).logits[:, -3, candidates]
            rewards.append(logits.softmax(dim=-1)[0, 0].item())
        out.append(rewards)
    return out


def check(ours, ref, dtype):
    assert [len(r) for r in ours] == [len(r) for r in ref]
    for o_path, r_path in zip(ours, ref):
        for o, r in zip(o_path, r_path):
            assert abs(o - r) <= TOL[dtype] * max(abs(r), 1e-3), (o, r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qwen_math_prm_matches_reference(tiny, dtype):
    prm = ProcessRewardModel(tiny["qwen2_prm"], dtype=dtype)
    assert prm.format.name == "qwen_math_prm"
    ours = prm.score_paths(QUESTION, PATHS)
    check(ours, qwen_reference(tiny["qwen2_prm"], dtype, QUESTION, PATHS), dtype)
    flat = [r for path in ours for r in path]
    assert all(0.0 < r < 1.0 for r in flat) and max(flat) - min(flat) > 1e-3  # not a constant head


@pytest.mark.parametrize("dtype", DTYPES)
def test_rlhflow_prm_matches_reference(tiny, dtype):
    prm = ProcessRewardModel(tiny["llama_prm"], dtype=dtype)
    assert prm.format.name == "rlhflow"
    ours = prm.score_paths(QUESTION, PATHS)
    check(ours, rlhflow_reference(tiny["llama_prm"], dtype, QUESTION, PATHS), dtype)


@pytest.mark.parametrize("name", ["qwen2_prm", "llama_prm"])
def test_packing_does_not_change_scores(tiny, name):
    """Small token budgets split the work into several forwards; scores are unchanged."""
    big = ProcessRewardModel(tiny[name], dtype=torch.float64)
    small = ProcessRewardModel(tiny[name], dtype=torch.float64, max_batch_tokens=64)
    inputs = [e for e in big.encode_paths(QUESTION, PATHS) if e is not None]
    assert len(pack([len(i.token_ids) for i in inputs], small.max_batch_tokens)) > 2  # several forwards
    a, b = big.score_token_ids(inputs), small.score_token_ids(inputs)
    for x, y in zip(a, b):
        assert x == pytest.approx(y, rel=1e-12, abs=1e-12)


def test_token_level_entry(tiny):
    prm = ProcessRewardModel(tiny["qwen2_prm"], dtype=torch.float32)
    enc = prm.encode_paths(QUESTION, PATHS[:1])[0]
    assert isinstance(enc, PRMInput) and len(enc.reward_positions) == 2
    assert all(enc.token_ids[p] == prm.format.step_token_id for p in enc.reward_positions)
    # Rewards only depend on the prefix up to each position (causal): truncating after step 1 keeps it.
    cut = PRMInput(enc.token_ids[: enc.reward_positions[0] + 1], enc.reward_positions[:1])
    full, first = prm.score_token_ids([enc, cut])
    assert first[0] == pytest.approx(full[0], rel=1e-5)


def test_rlhflow_reward_positions_precede_plus(tiny):
    prm = ProcessRewardModel(tiny["llama_prm"], dtype=torch.float32)
    enc = prm.format.encode(QUESTION, ["2 + 3 = 5", "so +5 - 1 = 4"])  # "+" inside steps must not count
    assert len(enc.reward_positions) == 2
    for p in enc.reward_positions:
        assert enc.token_ids[p + 1] == prm.format.plus_id
        assert tuple(enc.token_ids[p + 1 - len(prm.format.header_ids) : p + 1]) == prm.format.header_ids
    assert enc.token_ids.count(prm.tokenizer.bos_token_id) == 1  # template BOS only, no double BOS
