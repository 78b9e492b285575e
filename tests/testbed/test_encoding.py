"""The testbed's training sequences are exactly what the harness feeds the models when serving."""

import random

import pytest

from specscale.data.arith import held_out_problems
from specscale.data.prompts import build_generator_prompt
from specscale.engine.text.prm_format import QwenMathPRMFormat
from specscale.testbed.encode import IGNORE, generator_batch, prm_batch, prompt_text
from specscale.testbed.prm_data import plant, sample_path
from specscale.testbed.tokenizer import testbed_tokenizer as make_tokenizer  # a "test" name would be collected


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer(0)


def test_tokenizer_is_deterministic_and_keeps_digits_apart(tok):
    assert make_tokenizer(0).get_vocab() == tok.get_vocab()
    ids = tok("37+45=82", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids] == list("37+45=82")
    assert len(tok.encode("\n\n", add_special_tokens=False)) == 1  # the step delimiter is one token


def test_generator_prompt_matches_the_harness_prompt(tok):
    for p in held_out_problems(5):
        assert build_generator_prompt(tok, p.question) == prompt_text(p.question)


def test_generator_loss_covers_the_answer_only(tok):
    p = held_out_problems(1)[0]
    b = generator_batch(tok, [p.question], [p.solution])
    ids, labels = b.input_ids[0].tolist(), b.lm_labels[0].tolist()
    n_prompt = len(tok(prompt_text(p.question), add_special_tokens=False)["input_ids"])
    targets = [y for y in labels if y != IGNORE]
    assert targets == ids[n_prompt:]
    assert tok.decode(targets) == p.solution + "<|im_end|>"


def test_prm_sequences_match_the_qwen_math_prm_format(tok):
    fmt = QwenMathPRMFormat(tok)
    rng = random.Random(1)
    paths = [sample_path(p, rng) for p in held_out_problems(20)]
    b = prm_batch(tok, paths)
    rows, cols = b.tag_index
    for r, path in enumerate(paths):
        enc = fmt.encode(path.question, list(path.steps))
        n = len(enc.token_ids)
        assert b.input_ids[r, :n].tolist() == list(enc.token_ids)
        assert cols[rows == r].tolist() == list(enc.reward_positions)
    assert b.tag_labels.tolist() == [y for p in paths for y in p.labels]


def test_prm_lm_targets_stop_at_the_first_error(tok):
    p = held_out_problems(30)[-1]
    path = plant(p, random.Random(0), 1)
    b = prm_batch(tok, [path])
    targets = tok.decode([y for y in b.lm_labels[0].tolist() if y != IGNORE])
    assert targets == path.steps[0]  # the right first step, nothing of the wrong second one
