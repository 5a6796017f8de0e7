"""The SDPO objective (self-distilled policy optimization, arXiv 2601.20802): a group policy gradient on
rewards plus self-distillation toward the model re-prompted with a successful sibling or feedback.

    loss = (1 - w) policy + w distillation,   w = distillation_weight

policy: `distill.objectives.group_policy` (normalised by loss_type); distillation: the SDFT losses
(`distill.objectives.self_distillation`: full / top-k + tail / sampled-token) on the rows the reward stage
gave a teacher prompt, as a mean over those rows' tokens, as the SDPO reference normalises it (its loss mask
is the response mask times the self-distillation mask):

    distillation = sum over distilled tokens of l_t / (distilled tokens of the step, all micro-batches and processes)

Dividing by all the step's tokens instead would weaken the term by the fraction of rows distilled (5x at
20%) and make its weight drift with the success rate from step to step. Like every count here the
denominator is step-wide, so the loss does not depend on how the step is split. The trainer divides every
loss sum by the step's token count T, so the distillation sum carries the factor T / T_distilled.
w = 0 is GRPO: no self-teacher is built and no teacher pass runs (the signal is None).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses import DistillLoss
from distill.objectives.base import StepContext, StudentTokens
from distill.objectives.group_policy import PolicySettings, group_policy_loss
from distill.objectives.self_distillation import METRICS as DISTILLATION_METRICS
from distill.objectives.self_distillation import (
    SelfDistillationObjective,
    SelfDistillationSettings,
)
from distill.signals import DENSE, SelfSignal
from distill.teachers.self_teacher import distilled_tokens

# The token counts are per-step means: each micro-batch adds its own count over 1 / (the step's micro-batches).
METRICS = ("sdpo/policy_loss", "sdpo/distillation_loss", "sdpo/clip_fraction", "sdpo/completion_tokens",
           "sdpo/distilled_tokens", *DISTILLATION_METRICS)


@dataclass(frozen=True)
class SDPOSettings:
    distillation_weight: float
    policy: PolicySettings
    distillation: SelfDistillationSettings


class SDPOObjective:
    """(1 - w) group policy loss + w self-distillation (module docstring)."""

    def __init__(self, settings: SDPOSettings):
        if not 0.0 <= settings.distillation_weight <= 1.0:
            raise ValueError(f"distillation_weight must be in [0, 1] (0: GRPO, 1: pure self-distillation), got "
                             f"{settings.distillation_weight!r}")
        self.settings = settings
        self.distillation = SelfDistillationObjective(settings.distillation)
        # w = 0 (GRPO) takes no teacher signal at all.
        self.signals = frozenset({DENSE}) if settings.distillation_weight > 0 else frozenset()
        # The distillation term is a mean over the step's distilled tokens (rows with a demonstration).
        self.step_counts = {"distilled_tokens": distilled_tokens}

    def __call__(self, tokens: StudentTokens, signal, context: StepContext) -> DistillLoss:
        w = self.settings.distillation_weight
        n = torch.tensor(float(tokens.targets.numel()))
        zero = torch.zeros((), device=tokens.hidden.device)
        share = torch.tensor(1.0 / context.step_micro_batches)
        metrics: dict = {"sdpo/completion_tokens": (n, share)}
        policy_sum, distillation_sum, stats, covered = zero, zero, None, None
        if w < 1.0:
            policy, clipped = group_policy_loss(tokens, context, self.settings.policy)
            policy_sum = policy.loss_sum
            metrics["sdpo/clip_fraction"] = (clipped.float().sum(), n)
        metrics["sdpo/policy_loss"] = (policy_sum.detach(), n)
        metrics["sdpo/distillation_loss"] = (zero, n)  # GRPO's; a distilled run's is its mean over distilled tokens
        loss_sum = (1.0 - w) * policy_sum
        if w > 0.0:
            distillation = self.distillation(tokens, signal, context)
            distillation_sum, stats, covered = distillation.loss_sum, distillation.stats, distillation.stats_tokens
            metrics.update(distillation.metrics or {})
            distilled = signal.distilled if isinstance(signal, SelfSignal) else None
            n_distilled = n if distilled is None else distilled.float().sum().cpu()
            metrics["sdpo/distillation_loss"] = (distillation_sum.detach(), n_distilled)
            metrics["sdpo/distilled_tokens"] = (n_distilled, share)
            # No distilled row in the step: the sum is zero, and stays in the graph (backward needs one).
            step_distilled = context.step_counts.get("distilled_tokens", 0)
            factor = context.step_tokens / step_distilled if step_distilled else 0.0
            loss_sum = loss_sum + w * distillation_sum * factor
        return DistillLoss(loss_sum, torch.tensor(tokens.targets.numel()), stats, metrics=metrics, stats_tokens=covered)
