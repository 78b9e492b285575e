"""Cheap, conservative string clean-up applied before any equivalence check.

Two layers:

- ``clean_answer``: what both sides go through before math_verify sees them
  (strip math delimiters, boxes, currency and percent signs, a final period).
- ``fast_key``: a canonical spelling for the exact-string fast path. Two answers
  with the same key are equivalent without calling sympy; different keys prove
  nothing, except that two plain integers (``integer_value``) are decided exactly.

Percentages (a decision, documented here and in the tests): the percent sign is
treated like a unit and dropped, so ``50\\%`` equals ``50`` (MATH references write
``50\\%`` while models often box ``50``). It is NOT read as a factor 1/100, so
``50\\%`` does not equal ``0.5``.
"""

from __future__ import annotations

import re

from specscale.grading.extract import extract_boxed

_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_PERCENT = re.compile(r"\\?%")
# Spacing macros and \left / \right carry no value.
_SPACING = re.compile(r"\\[,;:! ]|\\q?quad(?![A-Za-z])|\\left(?![A-Za-z])|\\right(?![A-Za-z])")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_INTEGER = re.compile(r"[+-]?\d+")
_GROUPED_INTEGER = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+")
_MAX_INTEGER_CHARS = 1000


def clean_answer(answer: str | None) -> str | None:
    """Strip presentation around an answer; ``None`` if nothing is left."""
    if not isinstance(answer, str):
        return None
    s = answer.strip()
    if not s:
        return None
    boxed = extract_boxed(s)
    if boxed is not None:
        s = boxed
    s = _strip_delimiters(s)
    s = s.replace("\\$", "").replace("$", "")  # currency; math delimiters are gone already
    s = _PERCENT.sub("", s)
    s = s.strip().rstrip(".").strip()
    return s or None


def _strip_delimiters(s: str) -> str:
    s = s.strip()
    for left, right in _DELIMITERS:
        if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)].strip()
    return s


def fast_key(cleaned: str) -> str:
    """Canonical spelling of an already cleaned answer for the exact fast path."""
    s = _SPACING.sub("", cleaned)
    s = _FRAC_VARIANTS.sub(r"\\frac", s)
    s = _DEGREES.sub("", s)
    return "".join(s.split())


def integer_value(key: str) -> int | None:
    """The integer a fast key spells ("-12", "1,200"), or None if it is anything else."""
    if len(key) > _MAX_INTEGER_CHARS:
        return None  # int() refuses very long digit strings; let the slow path decide
    if _INTEGER.fullmatch(key) or _GROUPED_INTEGER.fullmatch(key):
        return int(key.replace(",", ""))
    return None
