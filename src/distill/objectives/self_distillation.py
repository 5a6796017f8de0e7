"""The self-distillation objective (SDFT, arXiv 2601.19897): the student against itself shown privileged context.

The teacher signal is dense (the self-teacher's hidden states and lm_head); three losses, as `distillation_mode`:

    full_logits    generalized JSD (beta) over the whole vocabulary            `chunked_generalized_jsd`
    topk_logits    the same on the student's top-k tokens + one tail bucket     `student_topk_support` +
                   per distribution (the sparse path, with the teacher's tail     `sparse_generalized_jsd`
                   exact)
    sampled_token  reverse KL estimated on the sampled token: advantage          `chunked_policy_gradient`
                   A_t = sg[log pi_T(y_t) - log pi_S(y_t)], loss -A_t log pi_S(y_t) (REINFORCE); its value is
                   the per-token estimate log pi_S - log pi_T

When rollouts are reused (num_iterations > 1), a student-sampled token's loss is weighted by the importance
ratio w_t = min(pi_theta(y_t) / pi_old(y_t), distillation_is_clip) (a constant; log-ratio clamped to
[-20, 20]) on the later steps of a reuse window; on a fresh rollout (the window's first step) the ratio is
1 by definition and no weight is applied. Teacher-sampled completions
(generate_from_teacher) get no ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from distill.losses import DistillLoss, chunked_generalized_jsd, sparse_generalized_jsd
from distill.losses.policy_gradient import ClipSettings, chunked_policy_gradient
from distill.losses.student_topk import student_topk_support
from distill.losses.token_log_probs import token_log_probs
from distill.objectives.base import StepContext, StudentTokens
from distill.objectives.divergence import LossSettings, divergence
from distill.objectives.sampled import teacher_token_log_probs
from distill.signals import DENSE, DenseSignal, SelfSignal

MODES = ("full_logits", "topk_logits", "sampled_token")
METRICS = ("self_teacher/prompt_truncated", "self_teacher/rows_without_context", "self_distillation/is_weight",
           "self_distillation/is_capped")
MAX_LOG_RATIO = 20.0


@dataclass(frozen=True)
class SelfDistillationSettings:
    mode: str = "full_logits"
    beta: float = 0.0
    temperature: float = 1.0
    chunk_size: int = 256
    topk: int = 100
    is_clip: float | None = 2.0
    reused_rollouts: bool = False  # num_iterations > 1: importance weights against the recorded pi_old

    def __post_init__(self) -> None:
        """The loss's rules, in the config's words (a method's validation builds these settings to check them)."""
        if self.mode not in MODES:
            raise ValueError(f"distillation_mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "sampled_token" and self.beta != 1.0:
            raise ValueError(f"distillation_mode sampled_token estimates reverse KL on the sampled token only: set beta: 1 "
                             f"(got {self.beta}), or use full_logits / topk_logits for other betas")
        if self.topk < 1:
            raise ValueError(f"distillation_topk must be >= 1, got {self.topk!r}")
        if self.is_clip is not None and not (self.is_clip > 0 and math.isfinite(self.is_clip)):
            raise ValueError(f"distillation_is_clip must be a finite number > 0 (None: no cap), got {self.is_clip!r}")


class SelfDistillationObjective:
    """The student's tokens against a self-teacher's dense signal (module docstring)."""

    signals = frozenset({DENSE})

    def __init__(self, settings: SelfDistillationSettings):
        self.settings = settings

    def __call__(self, tokens: StudentTokens, signal: DenseSignal, context: StepContext) -> DistillLoss:
        s = self.settings
        current = None
        if s.mode == "sampled_token" or self._reweights(tokens, context):
            current = token_log_probs(tokens.hidden.detach(), tokens.head, tokens.targets, s.temperature, s.chunk_size)
        importance = self._importance_weights(tokens, current) if self._reweights(tokens, context) else None
        # some rows have no teacher prompt (sdpo): weight 0
        distilled = signal.distilled if isinstance(signal, SelfSignal) else None
        weights = importance
        if distilled is not None:
            weights = distilled.float() if weights is None else weights * distilled.float()
        if s.mode == "full_logits":
            out = self._full(tokens, signal, weights, context.return_stats and distilled is None)
        elif s.mode == "topk_logits":
            out = self._topk(tokens, signal, weights)
        else:
            out = self._sampled(tokens, signal, current, weights)
        stats, covered = out.stats, None
        if context.return_stats and (s.mode != "full_logits" or distilled is not None):
            seen_tokens, seen_signal = tokens, signal
            if distilled is not None:
                assert isinstance(signal, SelfSignal)  # only a self-teacher's signal carries `distilled`
                index = distilled.nonzero().squeeze(1)
                seen_tokens, covered = tokens.select(index), len(index)
                seen_signal = replace(signal, hidden=signal.hidden[index], distilled=None)
            with torch.no_grad():  # the full-vocabulary diagnostics, whatever the loss's support, on the distilled rows
                stats = divergence(seen_tokens, seen_signal, LossSettings(s.beta, s.temperature, s.chunk_size, True)).stats
        return out._replace(stats=stats, stats_tokens=covered, metrics=self._metrics(signal, importance, distilled))

    # -------------------------------------------------------------------------------------- losses --
    def _full(self, tokens: StudentTokens, signal: DenseSignal, weights, return_stats: bool) -> DistillLoss:
        s, head = self.settings, tokens.head
        return chunked_generalized_jsd(
            tokens.hidden, head.weight, signal.hidden, signal.head.weight, beta=s.beta, temperature=s.temperature,
            chunk_size=s.chunk_size, student_bias=head.bias, teacher_bias=signal.head.bias, student_logit_scale=head.scale,
            teacher_logit_scale=signal.head.scale, student_softcap=head.softcap, teacher_softcap=signal.head.softcap,
            return_stats=return_stats, token_weights=weights)

    def _topk(self, tokens: StudentTokens, signal: DenseSignal, weights) -> DistillLoss:
        s, head = self.settings, tokens.head
        k = min(s.topk, head.vocab_size)
        ids, teacher_lp, teacher_tail = student_topk_support(tokens.hidden, head, signal.hidden, signal.head, k,
                                                             s.temperature, s.chunk_size)
        return sparse_generalized_jsd(
            tokens.hidden, head.weight, ids, teacher_lp, teacher_tail_log_probs=teacher_tail, beta=s.beta,
            temperature=s.temperature, chunk_size=s.chunk_size, student_bias=head.bias, student_logit_scale=head.scale,
            student_softcap=head.softcap, token_weights=weights)

    def _sampled(self, tokens: StudentTokens, signal: DenseSignal, current: torch.Tensor, weights) -> DistillLoss:
        s = self.settings
        teacher = teacher_token_log_probs(tokens, signal, s.temperature, s.chunk_size)
        weights = torch.ones_like(current) if weights is None else weights
        # old=None: the ratio inside the surrogate is 1 (the importance weight is applied as a constant instead).
        loss, _ = chunked_policy_gradient(tokens.hidden, tokens.head, tokens.targets, teacher - current, weights, None,
                                          ClipSettings(), temperature=s.temperature, chunk_size=s.chunk_size)
        return loss

    # ------------------------------------------------------------------------------ importance weights --
    def _reweights(self, tokens: StudentTokens, context: StepContext) -> bool:
        return (self.settings.reused_rollouts and context.staleness > 0 and context.source == "student"
                and tokens.rollout_log_probs is not None)

    def _importance_weights(self, tokens: StudentTokens, current: torch.Tensor) -> torch.Tensor:
        """(N,) min(pi_theta / pi_old, distillation_is_clip) of each sampled token, a constant."""
        assert tokens.rollout_log_probs is not None  # `_reweights` checked it
        log_ratio = (current - tokens.rollout_log_probs.float()).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        ratio = log_ratio.exp()
        return ratio if self.settings.is_clip is None else ratio.clamp_max(self.settings.is_clip)

    # ------------------------------------------------------------------------------------- metrics --
    def _metrics(self, signal: DenseSignal, importance, distilled) -> dict:
        """The self-teacher's prompt counts, and the importance weights over the distilled positions."""
        metrics = {}
        if isinstance(signal, SelfSignal):
            rows = torch.tensor(float(signal.rows))
            metrics["self_teacher/prompt_truncated"] = (torch.tensor(float(signal.prompts_truncated)), rows)
            metrics["self_teacher/rows_without_context"] = (torch.tensor(float(signal.rows_without_context)), rows)
        if importance is not None:
            if distilled is not None:
                importance = importance[distilled]
            n = torch.tensor(float(importance.numel()))
            metrics["self_distillation/is_weight"] = (importance.sum(), n)
            cap = self.settings.is_clip
            capped = importance >= cap if cap is not None else torch.zeros_like(importance, dtype=torch.bool)
            metrics["self_distillation/is_capped"] = (capped.float().sum(), n)
        return metrics
