"""The IW-OPD objective (importance-weighted on-policy distillation, arXiv 2606.22600).

On the student's own samples y ~ pi_old, per completion token t:

    A_t = sg[log pi_T(y_t) - log pi_old(y_t)]                      the teacher's verdict on the sampled token
    w_t = sg[1 + gamma (1 - P_t / S)],  P_t = sum_{s<t} |A_s|,  S = max(sum_s |A_s|, eps)   per sequence
    loss = -sum_t w_t min(rho_t A_t, clip(rho_t) A_t)  (dual clip c for A_t < 0),  rho_t = pi_theta / pi_old

Micro-batches of other sources (the teacher-sampled warm-up phase) are trained with forward KL on the
full distribution (the divergence objective, beta 0): a policy gradient needs the learner's own samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses import DistillLoss
from distill.losses.policy_gradient import (
    ClipSettings,
    chunked_policy_gradient,
    prefix_decayed_weights,
)
from distill.objectives.base import StepContext, StudentTokens
from distill.objectives.divergence import LossSettings, divergence
from distill.objectives.sampled import sampling_log_probs, teacher_token_log_probs
from distill.signals import DENSE, SPARSE

METRICS = ("iw_opd/advantage", "iw_opd/abs_advantage", "iw_opd/weight", "iw_opd/clip_fraction", "iw_opd/ratio")
MAXIMA = ("iw_opd/weight_max",)
MINIMA = ("iw_opd/weight_min",)


@dataclass(frozen=True)
class IWOPDSettings:
    gamma: float = 0.5
    epsilon: float = 1e-8
    clip: ClipSettings = ClipSettings()
    temperature: float = 1.0
    chunk_size: int = 256
    reused_rollouts: bool = False  # num_iterations > 1: the ratio against the recorded pi_old, clipped


class IWOPDObjective:
    """Sampled-token IW-OPD on student samples; forward KL on teacher-sampled warm-up micro-batches."""

    signals = frozenset({DENSE, SPARSE})

    def __init__(self, settings: IWOPDSettings):
        self.settings = settings

    def __call__(self, tokens: StudentTokens, signal, context: StepContext) -> DistillLoss:
        s = self.settings
        if context.source != "student":
            return divergence(tokens, signal, LossSettings(0.0, s.temperature, s.chunk_size, context.return_stats))
        teacher = teacher_token_log_probs(tokens, signal, s.temperature, s.chunk_size)
        old = sampling_log_probs(tokens, s.temperature, s.chunk_size)
        advantages = teacher - old
        weights = prefix_decayed_weights(advantages, tokens.rows, s.gamma, s.epsilon)
        # A fresh rollout (every step's with num_iterations 1, a reuse window's first step's otherwise) is the
        # current policy's: rho = 1 by definition, not by the (bf16 vs fp32) numerics of generation and
        # training; the advantage still uses the recorded sampling log-probs.
        reused = s.reused_rollouts and context.staleness > 0
        loss, facts = chunked_policy_gradient(tokens.hidden, tokens.head, tokens.targets, advantages, weights,
                                              old if reused else None, s.clip,
                                              temperature=s.temperature, chunk_size=s.chunk_size)
        n = torch.tensor(float(advantages.numel()))
        metrics = {"iw_opd/advantage": (advantages.sum(), n), "iw_opd/abs_advantage": (advantages.abs().sum(), n),
                   "iw_opd/weight": (weights.sum(), n), "iw_opd/clip_fraction": (facts["clipped"].float().sum(), n),
                   "iw_opd/ratio": (facts["ratio"].sum(), n)}
        extrema = {}
        if advantages.numel():
            extrema = {"iw_opd/weight_max": weights.max(), "iw_opd/weight_min": weights.min()}
        stats = None
        if context.return_stats:  # the usual KLs and agreement on logging steps, from the full distributions
            with torch.no_grad():
                stats = divergence(tokens, signal, LossSettings(0.0, s.temperature, s.chunk_size, True)).stats
        return loss._replace(stats=stats, metrics=metrics, extrema=extrema)
