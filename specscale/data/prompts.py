"""The generator's prompt for PRM-guided beam search, and how rounds continue it.

The system prompt follows the recipe of huggingface/search-and-learn (short
problems: a brief solution; longer ones: "## Step k:" sections separated by blank
lines; a fixed closing sentence with the boxed answer), in our own words. The
blank line matters: the search cuts steps at ``STEP_DELIMITER`` ("\\n\\n"), so the
format makes one section one step, and the closing sentence puts the answer where
``specscale.grading.extract_boxed`` finds it.

Rounds continue ONE assistant message: the prompt of round r is the chat-templated
system + user turns with the generation prompt, followed verbatim by the assistant
text produced so far (delimiters included), with no end-of-turn token. It is built
by string concatenation rather than ``continue_final_message`` because some chat
templates strip or rewrite message content; concatenation guarantees that the
prompt of round r+1 extends the prompt of round r character for character, which
keeps the KV-cache prefix shared across rounds.
"""

from __future__ import annotations

from typing import Any

STEP_DELIMITER = "\n\n"

FINAL_ANSWER_SENTENCE = "Therefore, the final answer is: $\\boxed{answer}$. I hope it is correct."

SYSTEM_PROMPT = (
    "Work out the math problem below, keeping the solution clear and to the point.\n\n"
    "If the problem is short (about two steps or fewer), give a brief solution with only "
    "the explanation it needs.\n\n"
    "If the problem is longer (three steps or more), lay the solution out in numbered "
    "steps, each one a separate block:\n\n"
    "## Step 1: [what this step does, in a few words]\n"
    "[the reasoning and calculations for it]\n\n"
    "## Step 2: [what this step does, in a few words]\n"
    "[the reasoning and calculations for it]\n\n"
    "...\n\n"
    "Whichever format you use, finish with this exact sentence:\n\n"
    f"{FINAL_ANSWER_SENTENCE}\n\n"
    "In that sentence, replace answer with only the final number or expression that solves the problem."
)

# Jinja chat template in the Qwen style, for tokenizers that ship without one
# (tiny test tokenizers). Real generators use their own template.
QWEN_STYLE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_messages(problem_text: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """System + user turns of the generator conversation."""
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": problem_text},
    ]


def build_generator_prompt(
    tokenizer: Any,
    problem_text: str,
    assistant_prefix: str = "",
    *,
    system_prompt: str = SYSTEM_PROMPT,
    chat_template: str | None = None,
) -> str:
    """Prompt text for one round: templated conversation + the assistant text so far.

    ``assistant_prefix`` is the path's text up to now ("" in round 0), steps and
    their "\\n\\n" delimiters included; it is appended as is. ``chat_template``
    overrides the tokenizer's template; a tokenizer without one is an error (a
    silent fallback would feed a real model the wrong format).
    """
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    if not template:
        raise ValueError(
            "the generator tokenizer has no chat template; pass chat_template= "
            "(e.g. specscale.data.prompts.QWEN_STYLE_CHAT_TEMPLATE for Qwen-style models)"
        )
    templated = tokenizer.apply_chat_template(
        build_messages(problem_text, system_prompt),
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
    )
    return templated + assistant_prefix
