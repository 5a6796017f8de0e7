"""Repetition: how often greedy answers end in a loop, and how varied their words are.

A small student decoded greedily can fall into a loop ("A concept of a concept of a concept ...") and stay in it
until the token budget cuts it off. An answer *loops* when its last words are periodic: some unit of 1 to
`MAX_PERIOD` words repeats, back to back, right up to the end of the answer, at least `MIN_REPEATS` times (the
last repeat may be cut short) over at least `MIN_LOOP_WORDS` words. A loop in the middle that the answer leaves
is not counted: the measure is about answers that never get out.

distinct-n (Li et al., 2016, arXiv 1510.03055): distinct n-grams over all n-grams of all the answers together,
a corpus-level diversity in (0, 1]; loops drive it down. Words are lower case, letters and digits (as the answer
accuracy normalises them), so punctuation and case do not hide or make a loop.
"""

from __future__ import annotations

from distill.tasks.answers import normalise

MAX_PERIOD = 8
MIN_REPEATS = 3
MIN_LOOP_WORDS = 6


def answer_words(answer: str) -> list[str]:
    return normalise(answer).split()


def loop_period(words: list[str], max_period: int = MAX_PERIOD, min_repeats: int = MIN_REPEATS,
                min_words: int = MIN_LOOP_WORDS) -> int | None:
    """The shortest period p <= max_period whose repeats run to the end of `words`, or None.

    The periodic tail for p is the longest suffix where every word equals the one p before it, plus the p words it
    starts from; it is a loop when it spans at least max(min_repeats * p, min_words) words."""
    for period in range(1, max_period + 1):
        matched = 0
        while matched + period < len(words) and words[-1 - matched] == words[-1 - matched - period]:
            matched += 1
        if matched + period >= max(min_repeats * period, min_words):
            return period
    return None


def distinct_n(answers: list[list[str]], n: int) -> float:
    """Distinct n-grams / all n-grams over every answer (0.0 when the answers hold no n-gram)."""
    grams = [tuple(words[i : i + n]) for words in answers for i in range(len(words) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repetition(answers: list[str]) -> dict:
    """{"answers", "looping", "loop_fraction", "distinct_1", "distinct_2", "example"}: the answers that end in a loop,
    the diversity of their words, and one looping unit (None when no answer loops)."""
    words = [answer_words(answer) for answer in answers]
    periods = [loop_period(w) for w in words]
    looping = [(w, p) for w, p in zip(words, periods) if p is not None]
    example = " ".join(looping[0][0][-looping[0][1]:]) if looping else None
    return {"answers": len(answers), "looping": len(looping), "loop_fraction": len(looping) / max(len(answers), 1),
            "distinct_1": distinct_n(words, 1), "distinct_2": distinct_n(words, 2), "example": example}
