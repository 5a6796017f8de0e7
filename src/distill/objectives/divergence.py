"""The divergence objective: pull the student's next-token distributions toward the teacher's.

Which divergence depends on the signal the teacher gives:
    dense    generalized JSD over the full vocabulary, chunked from hidden states (`chunked_generalized_jsd`)
    sparse   generalized JSD on the teacher's top-k + the completion token + a tail bucket (`sparse_generalized_jsd`)
    aligned  ULD / hybrid ULD on byte-aligned groups across tokenizers (`chunked_uld`)
with beta interpolating forward KL (0) and reverse KL (1). The evaluation uses it too (beta 0, temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from distill.losses import DistillLoss, chunked_generalized_jsd, sparse_generalized_jsd
from distill.losses.token_log_probs import token_log_probs
from distill.losses.uld import chunked_uld
from distill.objectives.base import StepContext, StudentTokens
from distill.objectives.routing import per_teacher
from distill.objectives.staleness import StalenessCorrection
from distill.objectives.step_weighting import StepDivergenceWeighting
from distill.signals import (
    ALIGNED,
    DENSE,
    SPARSE,
    AlignedSignal,
    DenseSignal,
    SparseSignal,
)


@dataclass(frozen=True)
class LossSettings:
    """beta, loss temperature, tokens per chunk, per-token diagnostics on/off."""

    beta: float
    temperature: float
    chunk_size: int
    return_stats: bool = False


def divergence(tokens: StudentTokens, signal, settings: LossSettings) -> DistillLoss:
    """Loss sum of the student's tokens against any teacher signal (routed ones part by part)."""
    return per_teacher(lambda part, part_signal: _one_teacher(part, part_signal, settings), tokens, signal)


def _one_teacher(tokens: StudentTokens, signal, settings: LossSettings) -> DistillLoss:
    head = tokens.head
    if isinstance(signal, DenseSignal):
        return chunked_generalized_jsd(
            tokens.hidden, head.weight, signal.hidden, signal.head.weight,
            beta=settings.beta, temperature=settings.temperature, chunk_size=settings.chunk_size,
            student_bias=head.bias, teacher_bias=signal.head.bias,
            student_logit_scale=head.scale, teacher_logit_scale=signal.head.scale,
            student_softcap=head.softcap, teacher_softcap=signal.head.softcap,
            return_stats=settings.return_stats, token_weights=tokens.loss_weights,
        )
    if isinstance(signal, SparseSignal):
        _same_temperature("log-probs", signal.temperature, settings.temperature)
        sampled = signal.sampled_log_probs is not None
        return sparse_generalized_jsd(
            tokens.hidden, head.weight, signal.topk_ids, signal.topk_log_probs,
            sampled_ids=tokens.targets if sampled else None, teacher_sampled_log_probs=signal.sampled_log_probs,
            teacher_tail_log_probs=signal.tail_log_probs, beta=settings.beta, temperature=settings.temperature,
            chunk_size=settings.chunk_size, student_bias=head.bias, student_logit_scale=head.scale,
            student_softcap=head.softcap, return_stats=settings.return_stats, token_weights=tokens.loss_weights,
        )
    if isinstance(signal, AlignedSignal):
        if tokens.loss_weights is not None:
            raise ValueError("ULD on byte-aligned groups takes no per-token weights (gold: staleness_correction none)")
        _same_temperature("group prefixes", signal.temperature, settings.temperature)
        return chunked_uld(tokens.hidden, head, tokens.targets, signal.alignment, signal.teacher_hidden, signal.head,
                           signal.teacher_log_prefix, signal.settings, beta=settings.beta, temperature=settings.temperature,
                           chunk_size=settings.chunk_size)
    raise TypeError(f"the divergence objective cannot use a {type(signal).__name__}")


def _same_temperature(what: str, given: float, asked: float) -> None:
    if abs(given - asked) > 1e-6:
        raise ValueError(f"the teacher's {what} are at temperature {given}, the loss asks for {asked}: score the "
                         "teacher at the loss temperature")


class DivergenceObjective:
    """Generalized JSD (ULD across tokenizers) with a beta per completion source (GKD, on-policy, GOLD)."""

    def __init__(self, beta_for: Callable[[str], float], temperature: float, chunk_size: int,
                 signals: frozenset[str] = frozenset({DENSE, SPARSE, ALIGNED}), staleness: StalenessCorrection | None = None,
                 step_weighting: StepDivergenceWeighting | None = None):
        """`staleness`: how student samples drawn by older weights are weighted (`max_staleness` > 0), or None;
        `step_weighting`: SOD's weights of the student's conversations' turns (`step_divergence_weighting`), or None."""
        self.beta_for, self.temperature, self.chunk_size, self.signals = beta_for, temperature, chunk_size, signals
        self.staleness, self.step_weighting = staleness, step_weighting

    @classmethod
    def constant(cls, beta: float, temperature: float, chunk_size: int) -> "DivergenceObjective":
        """One beta for every source (the evaluation, tests)."""
        return cls(lambda source: beta, temperature, chunk_size)

    def __call__(self, tokens: StudentTokens, signal, context: StepContext) -> DistillLoss:
        settings = LossSettings(self.beta_for(context.source), self.temperature, self.chunk_size, context.return_stats)
        stale = self.staleness is not None and context.source == "student" and context.staleness != 0
        stepwise = self.step_weighting is not None and context.source == "student"
        if not stale and not stepwise:
            return divergence(tokens, signal, settings)
        weights: torch.Tensor | None = None
        metrics: dict = {}
        extrema: dict = {}
        if stale:
            assert self.staleness is not None
            if tokens.rollout_log_probs is None or tokens.rows is None:
                raise ValueError("a stale student micro-batch reached the loss without its sampling log-probs")
            current = token_log_probs(tokens.hidden.detach(), tokens.head, tokens.targets, self.temperature, self.chunk_size)
            weights, metrics, extrema = self.staleness.weights(current - tokens.rollout_log_probs, tokens.rows)
        if stepwise:
            assert self.step_weighting is not None
            steps, step_metrics = self.step_weighting.weights(tokens, signal, self.temperature, self.chunk_size)
            weights, metrics = (steps if weights is None else weights * steps), {**metrics, **step_metrics}
        loss = divergence(replace(tokens, loss_weights=weights), signal, settings)
        return loss._replace(metrics={**(loss.metrics or {}), **metrics}, extrema={**(loss.extrema or {}), **extrema})
