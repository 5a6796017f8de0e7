"""What every teacher does: score a micro-batch into a signal (`distill.signals`), and maybe sample.

A teacher scores a micro-batch (`Teacher.score`) and returns a signal covering its N completion-predicting
positions, in row-major order. The signal is data; the method's objective decides what to learn from it,
so the trainer, denominators and metrics are the same whatever the teacher.

    local (same tokenizer) -> DenseSignal    teachers/local.py
    server / offline cache -> SparseSignal   teachers/topk_client.py, teachers/offline.py (format: teachers/cache/)
    another tokenizer      -> AlignedSignal  teachers/cross_tokenizer.py
    several, by teacher_id -> RoutedSignal   teachers/routed.py
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

import torch

from distill.batch import MicroBatch
from distill.data import Example
from distill.generation import SamplingParams
from distill.generation.sample import Sample
from distill.losses import LogitHead
from distill.models.inputs import RowExtras


class Teacher(ABC):
    """Scores micro-batches into signals; optionally samples completions (seq_kd) when `can_generate`.

    Every member a caller uses is declared here, with the default that is safe when a teacher says nothing:

    can_generate: it can sample completions (`generate`); False by default.
    continues_prompts: its `generate` continues the student ids it is given, so it can act in the tool-call loop
        turn after turn; False for one that renders its own prompts (another tokenizer, a self-teacher's prompts).
    aligned: its signal is the cross-tokenizer aligned one (no same-vocabulary KL in the evaluation).
    frozen: its weights never change during the run, so its samples may be drawn steps ahead (seq_kd's
        window). False by default: a teacher whose weights move must not have stale samples drawn for it.
    head: its lm_head, where this process holds one (a model here, a hidden-state server's, a cross-tokenizer
        teacher's); None by default (a top-k server, a cache: `distill doctor` then reads no head from it).
    device: where it takes the micro-batches it scores (its model's device); the CPU by default (a teacher
        outside the process).
    score / score_many: the signal of one micro-batch, or of a whole step's (a remote teacher sends them in
        one concurrent round; the default scores one by one).
    score_divergence: the signal the evaluation compares with (the default: `score`'s).
    generate: completions in student ids; refused unless the teacher can generate.
    sampling_models(visit): the models `generate` samples from, for an engine that prepares replicas.
    close(): release what it holds open (connections), once at the end.
    """

    can_generate: bool = False
    continues_prompts: bool = False
    aligned: bool = False
    head: LogitHead | None = None
    device: torch.device = torch.device("cpu")

    @property
    def frozen(self) -> bool:
        return False

    @abstractmethod
    def score(self, batch: MicroBatch, temperature: float):
        """The signal at `batch`'s N trained positions, in row-major order (`distill.signals`)."""

    def score_many(self, batches: list[MicroBatch], temperature: float) -> list:
        return [self.score(batch, temperature) for batch in batches]

    def score_divergence(self, batch: MicroBatch, temperature: float):
        """The signal of the evaluation's divergence (a cross-tokenizer teacher leaves out its cross-entropy term)."""
        return self.score(batch, temperature)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams, batch_size: int | None = None,
                 examples: list[Example] | None = None, seeds: list[int] | None = None,
                 extras: list[RowExtras] | None = None, seeded_rows: bool = False) -> list[Sample]:
        """Completions in student ids for the student's `prompts`, one `Sample` each; `examples` (the same prompts as
        dataset examples) are for teachers that render their own prompts (another tokenizer); `seeds`: one per prompt
        (`distill.seeds`); `extras`: the prompts' model inputs beyond the ids (a teacher of the
        student's kind takes them; one rendering its own prompts, its own); `seeded_rows`: draw each row from its own
        seed, never from torch's process RNG (a thread sampling beside training: `generate_completions`)."""
        raise TypeError(f"{type(self).__name__} cannot sample completions (can_generate is False)")

    def sampling_models(self, visit: Callable) -> None:
        """`visit(model)` for each model `generate` samples from; none by default."""

    def close(self) -> None:
        """Release what the teacher holds open; nothing by default."""


def check_teacher(teacher: object, where: str) -> None:
    """A location's built teacher is a `Teacher` (TypeError naming it otherwise): no duck-typed teacher whose
    missing members would be silently defaulted by its callers."""
    if teacher is not None and not isinstance(teacher, Teacher):
        raise TypeError(f"{where} built a {type(teacher).__name__}, which is not a distill.teachers.base.Teacher: subclass "
                        "Teacher (it declares every member callers use, with safe defaults such as frozen = False)")
