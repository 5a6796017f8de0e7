"""The group policy-gradient loss of GRPO-style RL (the policy part of sdpo), chunked from hidden states.

Per completion token t of row i, with the row's advantage A_i (`distill.methods.sdpo.stage`) and the ratio
rho_t = pi_theta(y_t) / pi_old(y_t) (1 on a fresh rollout, the first step of a reuse window included;
against the recorded sampling log-probs on the window's later steps), the PPO clipped surrogate l_t = -min(rho_t A_i, clip(rho_t, 1 - eps_low,
1 + eps_high) A_i) (`distill.losses.policy_gradient`). `loss_type` says how the l_t are normalised, each as
its paper defines it, over the whole optimizer step (G rows of a group may sit in other micro-batches or
processes):

    grpo     mean over the step's rows of each row's token mean:  sum_i (1/|o_i|) sum_t l_t / R
    dr_grpo  sum over tokens / (R * max_new_tokens)   (Dr. GRPO: no length bias)
    dapo     sum over tokens / the step's token count over all processes (DAPO's token-level loss)
    bnpo     each micro-batch's token mean, averaged over the step's micro-batches (the reference library's
             definition: it depends on how the step is split into micro-batches, by design)

The trainer divides every loss sum by the step's token count T, so each l_t here carries the weight
T / (its loss_type's denominator): the division then gives exactly the loss above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses import DistillLoss
from distill.losses.policy_gradient import ClipSettings, chunked_policy_gradient
from distill.objectives.base import StepContext, StudentTokens

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


@dataclass(frozen=True)
class PolicySettings:
    loss_type: str = "dapo"
    clip: ClipSettings = ClipSettings(dual_clip=None)
    temperature: float = 1.0
    chunk_size: int = 256
    max_new_tokens: int = 48  # dr_grpo's constant length
    reused_rollouts: bool = False  # num_iterations > 1: the ratio against the recorded sampling log-probs

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")


def normaliser_weights(loss_type: str, rows: torch.Tensor, context: StepContext, max_new_tokens: int) -> torch.Tensor:
    """(N,) float32: T / (the loss_type's denominator for each token), T = context.step_tokens."""
    n = rows.shape[0]
    total = float(context.step_tokens)
    if loss_type == "dapo" or n == 0:
        return torch.ones(n, dtype=torch.float32, device=rows.device)
    if loss_type == "grpo":
        lengths = torch.bincount(rows).to(torch.float64)
        return (total / (context.step_rows * lengths[rows])).float()
    if loss_type == "dr_grpo":
        return torch.full((n,), total / (context.step_rows * max_new_tokens), dtype=torch.float32, device=rows.device)
    return torch.full((n,), total / (context.step_micro_batches * n), dtype=torch.float32, device=rows.device)  # bnpo


def group_policy_loss(tokens: StudentTokens, context: StepContext, settings: PolicySettings) -> tuple[DistillLoss, torch.Tensor]:
    """The loss sum in the trainer's units (module docstring) and (N,) bool: the tokens a clip chose."""
    if tokens.advantages is None:
        raise ValueError("the group policy loss needs each row's advantage (a reward stage sets them)")
    weights = normaliser_weights(settings.loss_type, tokens.rows, context, settings.max_new_tokens)
    old = tokens.rollout_log_probs if settings.reused_rollouts and context.staleness > 0 else None
    loss, facts = chunked_policy_gradient(tokens.hidden, tokens.head, tokens.targets, tokens.advantages, weights, old,
                                          settings.clip, temperature=settings.temperature, chunk_size=settings.chunk_size)
    return loss, facts["clipped"]
