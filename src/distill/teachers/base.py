"""What every teacher does: score a micro-batch into a signal (`distill.signals`), and maybe sample.

A teacher scores a micro-batch (`Teacher.score`) and returns a signal covering its N completion-predicting
positions, in row-major order. The signal is data; the method's objective decides what to learn from it,
so the trainer, denominators and metrics are the same whatever the teacher.

    local (same tokenizer) -> DenseSignal    teachers/local.py
    server / offline cache -> SparseSignal   teachers/server.py, teachers/offline.py (format: teachers/cache.py)
    another tokenizer      -> AlignedSignal  teachers/cross_tokenizer.py
    several, by teacher_id -> RoutedSignal   teachers/routed.py
"""

from __future__ import annotations

from typing import Protocol

from distill.batch import MicroBatch
from distill.data import Example
from distill.generation import SamplingParams


class Teacher(Protocol):
    """Scores micro-batches; optionally samples completions (seq_kd) when `can_generate`."""

    can_generate: bool

    def score(self, batch: MicroBatch, temperature: float): ...

    def generate(self, prompts: list[list[int]], sampling: SamplingParams, batch_size: int | None = None,
                 examples: list[Example] | None = None, seeds: list[int] | None = None) -> list[tuple[list[int], bool]]:
        """Completions in student ids for the student's `prompts`; `examples` (the same prompts as dataset
        examples) are for teachers that render their own prompts (another tokenizer); `seeds`: one per prompt
        (`distill.generation.seeds`)."""
