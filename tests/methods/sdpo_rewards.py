"""Reward functions the sdpo tests name by import path ('tests.methods.sdpo_rewards:NAME')."""

from __future__ import annotations


def odd_length(prompts, completions, rows) -> list[float]:
    """1 for a completion with an odd number of characters: random tiny models get mixed groups."""
    return [float(len(text) % 2) for text in completions]


odd_length.reward_range = (0.0, 1.0)


def length_score(prompts, completions, rows) -> list[float]:
    """A graded reward (no declared range): the completion's length in characters, over 10."""
    return [len(text) / 10 for text in completions]


def wrong_length(prompts, completions, rows) -> list[float]:
    return [1.0] * (len(completions) + 1)


def not_finite(prompts, completions, rows) -> list[float]:
    return [float("nan")] * len(completions)


def raises_on_row_5(prompts, completions, rows) -> list[float]:
    """Raises when the batch holds dataset row 5 (rows carry an 'id' column)."""
    for row in rows:
        if row["id"] == 5:
            raise KeyError("no grader for this row")
    return [0.0] * len(completions)


def uses_prompts_and_rows(prompts, completions, rows) -> list[float]:
    """1 when the completion's length parity matches the row's 'parity' column (checks what is passed)."""
    assert len(prompts) == len(completions) == len(rows) and all(isinstance(p, (str, list)) for p in prompts)
    return [float(len(text) % 2 == row["parity"]) for text, row in zip(completions, rows)]
