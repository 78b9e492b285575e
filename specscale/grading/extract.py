"""Pull final answers out of model text and dataset references.

Both extractors are total: whatever the input (garbage, truncated generations,
unbalanced braces, non-strings), they return a string or ``None`` ("no answer")
and never raise. The search calls them on every finished path, so one odd
generation must not take a whole request down.
"""

from __future__ import annotations

import re

# A box command not followed by another letter, so "\fboxsep" or "\boxedx" are not boxes.
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")


def extract_boxed(text: object) -> str | None:
    """Return the content of the LAST ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    The last box counts because models often restate or correct themselves; the
    generator prompt asks for the answer in the closing sentence. Braces are
    matched with a depth counter (escaped ``\\{`` / ``\\}`` do not count, so set
    answers like ``\\boxed{\\{1,2\\}}`` work). If the last box never closes (a
    truncated generation), the answer is ``None``: we do not fall back to an earlier
    box, which the model may have already revised. The brace-less form
    ``\\boxed 5`` is accepted up to the next whitespace or ``$``. Empty boxes give
    ``None``.
    """
    if not isinstance(text, str) or not text:
        return None
    last = None
    for last in _BOX_COMMAND.finditer(text):
        pass
    if last is None:
        return None
    i = last.end()
    n = len(text)
    if i < n and text[i] == "{":
        content = _balanced_group(text, i)
    elif i < n and text[i] == " ":
        # "\boxed 5$" style: skip the spaces, take one bare token.
        while i < n and text[i] == " ":
            i += 1
        j = i
        while j < n and not text[j].isspace() and text[j] != "$":
            j += 1
        content = text[i:j]
    else:
        return None
    if content is None:
        return None
    content = content.strip()
    return content or None


def _balanced_group(text: str, open_at: int) -> str | None:
    """Content between ``text[open_at] == "{"`` and its matching ``}``, else None."""
    depth = 0
    i = open_at
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2  # skip the escaped character (\{, \}, \\ ...)
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : i]
        i += 1
    return None


def extract_gsm8k_reference(text: object) -> str | None:
    """Final answer of a GSM8K reference solution: what follows the last ``####``.

    GSM8K writes numbers with thousands separators ("#### 1,200"); commas are
    removed so the reference is a plain number. Only the first line after the
    marker is used; a trailing period or dollar sign is dropped.
    """
    if not isinstance(text, str):
        return None
    at = text.rfind("####")
    if at < 0:
        return None
    tail = text[at + 4 :].strip()
    if not tail:
        return None
    answer = tail.splitlines()[0].replace(",", "").replace("$", "").strip().rstrip(".").strip()
    return answer or None
