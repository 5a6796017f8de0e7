"""What every teacher gives the loss: a `TeacherSignal` per micro-batch.

A teacher scores a micro-batch (`Teacher.score`) and returns a signal covering its N completion-predicting
positions, in row-major order. The signal knows which loss it feeds: given the student's hidden states at
those same positions and the student's lm_head, `signal.loss(...)` returns a `DistillLoss` (sums, never
means). The student objective therefore never branches on the kind of teacher, and every method shares
the same trainer, denominators and metrics.

    local (same tokenizer) -> DenseSignal   -> chunked generalized JSD over the full vocabulary
    server / offline cache -> SparseSignal  -> sparse generalized JSD on top-k + sampled token + tail
    another tokenizer      -> AlignedSignal -> ULD / hybrid ULD on byte-aligned groups (teachers/cross_tokenizer.py)
    several, by teacher_id -> RoutedSignal  -> each part's own loss, summed, reported per teacher (teachers/routed.py)
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Protocol

import torch

from distill.data import Example
from distill.losses import (
    DistillLoss,
    LogitHead,
    chunked_generalized_jsd,
    sparse_generalized_jsd,
)
from distill.rollout import MicroBatch, SamplingParams


@dataclass(frozen=True)
class LossSettings:
    """The divergence each signal computes: beta, loss temperature, chunk size, diagnostics on/off."""

    beta: float
    temperature: float
    chunk_size: int
    return_stats: bool = False


class TeacherSignal(Protocol):
    def loss(self, student_hidden: torch.Tensor, student_head: LogitHead, targets: torch.Tensor, settings: LossSettings) -> DistillLoss:
        """student_hidden: (N, H) at the completion-predicting positions; targets: (N,) the tokens there."""

    def to(self, device: torch.device) -> "TeacherSignal": ...


class Teacher(Protocol):
    """Scores micro-batches; optionally samples completions (seq_kd) when `can_generate`."""

    can_generate: bool

    def score(self, batch: MicroBatch, temperature: float) -> TeacherSignal: ...

    def generate(self, prompts: list[list[int]], sampling: SamplingParams, batch_size: int | None = None,
                 examples: list[Example] | None = None) -> list[tuple[list[int], bool]]:
        """Completions in student ids for the student's `prompts`; `examples` (the same prompts as dataset
        examples) are for teachers that render their own prompts (another tokenizer)."""


@dataclass
class DenseSignal:
    """A same-vocabulary teacher's hidden states (N, H_t) and its lm_head: the full distribution, chunked."""

    hidden: torch.Tensor
    head: LogitHead

    def to(self, device: torch.device) -> "DenseSignal":
        return replace(self, hidden=self.hidden.to(device))

    def loss(self, student_hidden, student_head, targets, settings):
        return chunked_generalized_jsd(
            student_hidden, student_head.weight, self.hidden, self.head.weight,
            beta=settings.beta, temperature=settings.temperature, chunk_size=settings.chunk_size,
            student_bias=student_head.bias, teacher_bias=self.head.bias,
            student_logit_scale=student_head.scale, teacher_logit_scale=self.head.scale,
            student_softcap=student_head.softcap, teacher_softcap=self.head.softcap,
            return_stats=settings.return_stats,
        )


@dataclass
class SparseSignal:
    """A teacher's top-k log-probs per position, at the loss temperature (a server, a cache).

    topk_ids: (N, K) long; topk_log_probs: (N, K) float; sampled_log_probs: (N,) the teacher log-prob of
    the completion token at each position (it joins the support when the top-k missed it), or None;
    tail_log_probs: (N,) log of the mass outside the top-k (exact, from a cache), or None to derive it.
    `temperature` is the one the log-probs were computed at: the loss refuses any other.
    """

    topk_ids: torch.Tensor
    topk_log_probs: torch.Tensor
    sampled_log_probs: torch.Tensor | None
    tail_log_probs: torch.Tensor | None
    temperature: float

    def to(self, device: torch.device) -> "SparseSignal":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return SparseSignal(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})

    @property
    def num_positions(self) -> int:
        return self.topk_ids.shape[0]

    def loss(self, student_hidden, student_head, targets, settings):
        if abs(settings.temperature - self.temperature) > 1e-6:
            raise ValueError(f"the teacher's log-probs are at temperature {self.temperature}, the loss asks for "
                             f"{settings.temperature}: score the teacher at the loss temperature")
        sampled = self.sampled_log_probs is not None
        return sparse_generalized_jsd(
            student_hidden, student_head.weight, self.topk_ids, self.topk_log_probs,
            sampled_ids=targets if sampled else None, teacher_sampled_log_probs=self.sampled_log_probs,
            teacher_tail_log_probs=self.tail_log_probs, beta=settings.beta, temperature=settings.temperature,
            chunk_size=settings.chunk_size, student_bias=student_head.bias, student_logit_scale=student_head.scale,
            student_softcap=student_head.softcap, return_stats=settings.return_stats,
        )


def concat_sparse(signals: list[SparseSignal]) -> SparseSignal:
    """Stack sparse signals of consecutive position ranges (same K and temperature) into one."""
    first = signals[0]
    if any(s.topk_ids.shape[1] != first.topk_ids.shape[1] or s.temperature != first.temperature for s in signals):
        raise ValueError("sparse teacher signals to concatenate must share K and temperature")

    def cat(name):
        values = [getattr(s, name) for s in signals]
        if any(v is None for v in values):
            if not all(v is None for v in values):
                raise ValueError(f"sparse teacher signals disagree on whether {name} is given")
            return None
        return torch.cat(values)

    return SparseSignal(cat("topk_ids"), cat("topk_log_probs"), cat("sampled_log_probs"), cat("tail_log_probs"), first.temperature)
