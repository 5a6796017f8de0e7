"""Checking short answers: does a generated text contain a row's answer?

Both sides are normalised (lower case, every run of characters other than letters and digits becomes one
space) and the answer must appear as whole words: "12" is not found in "123", "paris" is found in
"It is Paris.". Used by the evaluation's answer accuracy (and by reward functions on checkable tasks).
"""

from __future__ import annotations

import re

_NOT_WORD = re.compile(r"[^0-9a-z]+")


def normalise(text: str) -> str:
    return _NOT_WORD.sub(" ", text.lower()).strip()


def contains_answer(text: str, answer: str) -> bool:
    """Whether `answer` appears in `text` as whole words, after normalisation (an empty answer never does)."""
    wanted = normalise(answer)
    return bool(wanted) and f" {wanted} " in f" {normalise(text)} "
