"""Supervised fine-tuning's objective: cross-entropy on the completion tokens, no teacher (method sft)."""

from __future__ import annotations

from distill.losses import DistillLoss
from distill.losses.cross_entropy import chunked_cross_entropy
from distill.objectives.base import StepContext, StudentTokens


class CrossEntropyObjective:
    """-sum_t log p_student(y_t) over the micro-batch's completion tokens; the signal is None (no teacher)."""

    signals: frozenset[str] = frozenset()

    def __init__(self, chunk_size: int):
        self.chunk_size = chunk_size

    def __call__(self, tokens: StudentTokens, signal, context: StepContext) -> DistillLoss:
        if signal is not None:
            raise TypeError(f"sft learns from the dataset's completions alone; it was given a {type(signal).__name__}")
        return chunked_cross_entropy(tokens.hidden, tokens.head, tokens.targets, self.chunk_size)
