"""Answer extraction: the last box wins, failures are None, nothing ever raises."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specscale.grading import extract_boxed, extract_gsm8k_reference


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is $\\boxed{42}$.", "42"),
        ("Therefore, the final answer is: $\\boxed{\\frac{1}{2}}$. I hope it is correct.", "\\frac{1}{2}"),
        ("first \\boxed{1}, then corrected: \\boxed{2}", "2"),  # the last box counts
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),  # escaped braces do not count
        ("\\boxed{ (-\\infty, 3] }", "(-\\infty, 3]"),
        ("\\fbox{7}", "7"),
        ("\\boxed{3} and finally \\fbox{4}", "4"),
        ("$\\boxed 5$", "5"),  # brace-less form
        ("\\boxed{\\boxed{9}}", "9"),
        ("\\boxed{x^{2}+1}", "x^{2}+1"),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no box here, the answer is 5",
        "\\boxed{12",  # truncated generation: unbalanced
        "\\boxed{1} and then \\boxed{2",  # the LAST box is unbalanced: no fallback to 1
        "\\boxed{}",
        "\\boxed{   }",
        "\\boxed",
        "\\boxedx{3}",  # not the command
        "\\fboxsep{3}",
        "}}}{{{\\boxed}{",
        None,
        42,
        b"\\boxed{1}",
    ],
)
def test_extract_boxed_failures_are_none(text):
    assert extract_boxed(text) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("He has 3 + 4 = <<3+4=7>>7 apples.\n#### 7", "7"),
        ("Total 1250 + 780 = 2030 items.\n#### 2,030", "2030"),
        ("#### -4", "-4"),
        ("#### 12.5", "12.5"),
        ("#### 18.", "18"),
        ("#### $1,200\n", "1200"),
    ],
)
def test_gsm8k_reference(text, expected):
    assert extract_gsm8k_reference(text) == expected


@pytest.mark.parametrize("text", ["", "no marker 12", "####", "####   \n", None, 3.5])
def test_gsm8k_reference_failures_are_none(text):
    assert extract_gsm8k_reference(text) is None


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("\\boxedfbox{}$#, 0123456789ab\n")) | st.characters(), max_size=80))
def test_extraction_never_raises_on_random_text(text):
    for result in (extract_boxed(text), extract_gsm8k_reference(text)):
        assert result is None or (isinstance(result, str) and result.strip() == result and result)
