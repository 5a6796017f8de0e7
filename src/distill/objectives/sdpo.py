"""The SDPO objective (self-distilled policy optimization, arXiv 2601.20802): a group policy gradient on
rewards plus self-distillation toward the model re-prompted with a successful sibling or feedback.

    loss = (1 - w) policy + w distillation,   w = distillation_weight

policy: `distill.objectives.group_policy` (normalised by loss_type); distillation: the SDFT losses
(`distill.objectives.self_distillation`: full / top-k + tail / sampled-token) on the rows the reward stage
gave a teacher prompt, divided like every method by the step's token count (rows without one add zero).
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
from distill.signals import DENSE

METRICS = ("sdpo/policy_loss", "sdpo/distillation_loss", "sdpo/clip_fraction", *DISTILLATION_METRICS)


@dataclass(frozen=True)
class SDPOSettings:
    distillation_weight: float
    policy: PolicySettings
    distillation: SelfDistillationSettings


class SDPOObjective:
    """(1 - w) group policy loss + w self-distillation (module docstring)."""

    def __init__(self, settings: SDPOSettings):
        if not 0.0 <= settings.distillation_weight <= 1.0:
            raise ValueError(f"distillation_weight must be in [0, 1], got {settings.distillation_weight!r}")
        self.settings = settings
        self.distillation = SelfDistillationObjective(settings.distillation)
        # w = 0 (GRPO) takes no teacher signal at all.
        self.signals = frozenset({DENSE}) if settings.distillation_weight > 0 else frozenset()

    def __call__(self, tokens: StudentTokens, signal, context: StepContext) -> DistillLoss:
        w = self.settings.distillation_weight
        n = torch.tensor(float(tokens.targets.numel()))
        zero = torch.zeros((), device=tokens.hidden.device)
        metrics: dict = {}
        policy_sum, distillation_sum, stats, covered = zero, zero, None, None
        if w < 1.0:
            policy, clipped = group_policy_loss(tokens, context, self.settings.policy)
            policy_sum = policy.loss_sum
            metrics["sdpo/clip_fraction"] = (clipped.float().sum(), n)
        if w > 0.0:
            distillation = self.distillation(tokens, signal, context)
            distillation_sum, stats, covered = distillation.loss_sum, distillation.stats, distillation.stats_tokens
            metrics.update(distillation.metrics or {})
        metrics["sdpo/policy_loss"] = (policy_sum.detach(), n)
        metrics["sdpo/distillation_loss"] = (distillation_sum.detach(), n)
        loss_sum = (1.0 - w) * policy_sum + w * distillation_sum
        return DistillLoss(loss_sum, torch.tensor(tokens.targets.numel()), stats, metrics=metrics, stats_tokens=covered)
