"""The generator prompt: chat template applied, assistant turn left open, "\n\n" kept."""

import pytest

from specscale.data import STEP_DELIMITER, SYSTEM_PROMPT, build_generator_prompt
from specscale.data.prompts import FINAL_ANSWER_SENTENCE, build_messages
from specscale.testbed.tokenizer import qwen_tokenizer

PROBLEM = "What is 12 + 30?"


@pytest.fixture(scope="module")
def tokenizer():
    return qwen_tokenizer()


def test_system_prompt_asks_for_steps_and_the_boxed_sentence():
    assert "## Step 1:" in SYSTEM_PROMPT and "## Step 2:" in SYSTEM_PROMPT
    assert SYSTEM_PROMPT.count(STEP_DELIMITER) >= 4
    assert "Therefore, the final answer is: $\\boxed{answer}$. I hope it is correct." in SYSTEM_PROMPT
    assert FINAL_ANSWER_SENTENCE in SYSTEM_PROMPT


def test_chat_template_applied(tokenizer):
    prompt = build_generator_prompt(tokenizer, PROBLEM)
    expected = (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{PROBLEM}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert prompt == expected
    assert prompt == tokenizer.apply_chat_template(
        build_messages(PROBLEM), tokenize=False, add_generation_prompt=True
    )


def test_assistant_continuation_has_no_end_of_turn(tokenizer):
    steps = "## Step 1: Add the numbers\n12 + 30 = 42." + STEP_DELIMITER
    round0 = build_generator_prompt(tokenizer, PROBLEM)
    round1 = build_generator_prompt(tokenizer, PROBLEM, assistant_prefix=steps)
    assert round1 == round0 + steps  # round r+1 extends round r exactly
    assert round1.endswith(STEP_DELIMITER)  # delimiter kept, nothing appended
    assert round1.count("<|im_end|>") == 2  # system and user turns only
    assert not round1.rstrip().endswith(tokenizer.eos_token)
    # the token ids of the earlier round are a prefix of the later one
    ids0 = tokenizer(round0, add_special_tokens=False)["input_ids"]
    ids1 = tokenizer(round1, add_special_tokens=False)["input_ids"]
    assert ids1[: len(ids0)] == ids0
    assert tokenizer.decode(ids1) == round1


def test_tokenizer_without_template_is_an_error(tokenizer):
    bare = qwen_tokenizer()
    bare.chat_template = None
    with pytest.raises(ValueError, match="chat_template"):
        build_generator_prompt(bare, PROBLEM)
    from specscale.data.prompts import QWEN_STYLE_CHAT_TEMPLATE

    assert build_generator_prompt(bare, PROBLEM, chat_template=QWEN_STYLE_CHAT_TEMPLATE) == build_generator_prompt(
        tokenizer, PROBLEM
    )
