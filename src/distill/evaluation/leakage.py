"""Template leakage: how often a student's greedy answers repeat words of the prompt template its self-teacher saw.

A self-teacher (sdft, sdpo) is the model shown a template around the privileged context ("This is an example
for a response to the question: ...", sdpo's reprompt). At the start of an answer it predicts the template's
continuation, and a student distilled from it can learn to open its own answers with those words. An answer
leaks when it contains a run of `LEAK_WORDS` (5) or more consecutive words of a template's literal text that
is not also in the question (words: lower case, letters and digits, as the answer accuracy normalises them;
the template's `{placeholders}` split its text, so no run spans one).
"""

from __future__ import annotations

import re

from distill.tasks.answers import normalise

LEAK_WORDS = 5
_PLACEHOLDER = re.compile(r"(?<!\{)\{[a-z_]+\}(?!\})")


def _runs(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def template_runs(templates: tuple[str, ...] | list[str], n: int = LEAK_WORDS) -> set[tuple[str, ...]]:
    """Every run of n consecutive words within each template's literal text (between placeholders)."""
    runs: set[tuple[str, ...]] = set()
    for template in templates:
        for literal in _PLACEHOLDER.split(template):  # then "{{" / "}}" are literal braces, not word characters
            runs |= _runs(normalise(literal).split(), n)
    return runs


def leaked_run(answer: str, question: str, runs: set[tuple[str, ...]], n: int = LEAK_WORDS) -> tuple[str, ...] | None:
    """The first template run the answer repeats that the question does not hold, or None."""
    candidates = runs - _runs(normalise(question).split(), n)
    words = normalise(answer).split()
    return next((run for i in range(len(words) - n + 1) if (run := tuple(words[i : i + n])) in candidates), None)


def template_leakage(answers: list[str], questions: list[str], templates: tuple[str, ...], n: int = LEAK_WORDS) -> dict:
    """{"leaked", "answers", "fraction", "example"}: how many answers repeat a template run (and one such run)."""
    runs = template_runs(templates, n)
    found = [leaked_run(a, q, runs, n) for a, q in zip(answers, questions)]
    hits = [run for run in found if run is not None]
    return {"leaked": len(hits), "answers": len(answers), "fraction": len(hits) / max(len(answers), 1),
            "example": " ".join(hits[0]) if hits else None}
