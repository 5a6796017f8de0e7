"""Sampled-token policy-gradient losses, chunked from hidden states (IW-OPD; the policy part of SDPO).

For completion tokens y_t sampled by a policy pi_old, with a per-token advantage A_t and weight w_t (both
constants), the clipped surrogate of PPO with the dual clip for negative advantages:

    rho_t = exp(log pi_theta(y_t) - log pi_old(y_t))
    s_t   = min(rho_t A_t, clip(rho_t, 1 - eps_low, 1 + eps_high) A_t)
    s_t   = max(s_t, c A_t)                      where A_t < 0 (dual clip, c > 1)
    loss  = -sum_t w_t s_t                        (a sum: the caller divides by the step's tokens)

d loss / d log pi_theta(y_t) = -w_t rho_t A_t where the unclipped term is the one chosen, else 0, and
d log pi(y_t) / d z = onehot(y_t) - softmax(z) for the logits z at the loss temperature: so the gradient
of a block is a (C, V) tensor built from the block's softmax, and the [tokens x vocab] logits never exist
at once (`ChunkedHeadLoss`). With fresh rollouts rho = 1 and the gradient is REINFORCE's, -w A grad log pi.

"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses.checks import check_chunk_size, check_temperature
from distill.losses.chunked import DistillLoss, LogitHead, run_chunked


@dataclass(frozen=True)
class ClipSettings:
    """PPO's ratio clip [1 - epsilon_low, 1 + epsilon_high] and the dual-clip bound (None: no dual clip)."""

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: float | None = 3.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon_low < 1.0 or not self.epsilon_high >= 0.0:
            raise ValueError(f"clip bounds: need 0 <= epsilon_low < 1 and epsilon_high >= 0, got {self.epsilon_low}, {self.epsilon_high}")
        if self.dual_clip is not None and not self.dual_clip > 1.0:
            raise ValueError(f"dual_clip must be > 1 (it bounds the loss of a negative advantage at c |A|), got {self.dual_clip}")


def surrogate(log_ratio: torch.Tensor, advantages: torch.Tensor, clip: ClipSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per token: the clipped surrogate s_t, d s_t / d log pi_theta, and whether a clip chose it (bool)."""
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip.epsilon_low, 1.0 + clip.epsilon_high) * advantages
    value = torch.minimum(unclipped, clipped)
    active = unclipped <= clipped  # the unclipped term is chosen (ties: the same value and slope)
    if clip.dual_clip is not None:
        floor = clip.dual_clip * advantages
        dual = (advantages < 0) & (value < floor)
        value = torch.where(dual, floor, value)
        active &= ~dual
    slope = torch.where(active, unclipped, torch.zeros_like(unclipped))
    return value, slope, ~active


def chunked_policy_gradient(
    hidden: torch.Tensor,
    head: LogitHead,
    targets: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    old_log_probs: torch.Tensor | None,
    clip: ClipSettings,
    *,
    temperature: float,
    chunk_size: int,
) -> tuple[DistillLoss, dict[str, torch.Tensor]]:
    """-sum_t w_t s_t over the N tokens (see the module docstring), and per-token facts for metrics.

    hidden: (N, H) the student's hidden states predicting targets (N,) long; advantages, weights,
    old_log_probs: (N,) float32 constants. old_log_probs None: the rollout is this policy's own, fresh
    (pi_old = sg[pi_theta]), so rho = 1 exactly and no clip engages, whatever precision generation ran
    in. Returns the loss and {"ratio": (N,), "clipped": (N,) bool}.
    """
    n = hidden.shape[0]
    advantages, weights = advantages.detach().float(), weights.detach().float()
    old = None if old_log_probs is None else old_log_probs.detach().float()
    for name, values in (("advantages", advantages), ("weights", weights), ("old_log_probs", old)):
        if values is not None and values.shape != (n,):
            raise ValueError(f"{name} must have shape ({n},), got {tuple(values.shape)}")
    ratio_out = torch.ones(n, dtype=torch.float32, device=hidden.device)
    clipped_out = torch.zeros(n, dtype=torch.bool, device=hidden.device)

    def make_objective(valid_rows):
        def objective(rows, logits, need_grad):
            log_norm = logits.logsumexp(dim=-1, keepdim=True)
            picked = logits.gather(1, targets[rows].unsqueeze(1)).squeeze(1) - log_norm.squeeze(1)
            log_ratio = picked - (picked if old is None else old[rows])
            value, slope, clipped = surrogate(log_ratio, advantages[rows], clip)
            ratio_out[rows], clipped_out[rows] = log_ratio.exp(), clipped
            grad = None
            if need_grad:  # d(-w s)/dz = -w slope (onehot - softmax)
                coefficient = -(weights[rows] * slope).unsqueeze(1)
                grad = logits.sub_(log_norm).exp_().mul_(-coefficient)
                grad.scatter_add_(1, targets[rows].unsqueeze(1), coefficient)
            return -(weights[rows] * value), grad, None

        return objective

    loss = run_chunked(hidden, head, None, make_objective, check_temperature(temperature), check_chunk_size(chunk_size), False)
    return loss, {"ratio": ratio_out, "clipped": clipped_out}


def prefix_decayed_weights(advantages: torch.Tensor, rows: torch.Tensor, gamma: float, epsilon: float) -> torch.Tensor:
    """IW-OPD's weight w_t = 1 + gamma (1 - P_t / S) per token, (N,) float32, no gradient.

    advantages: (N,) in row-major order; rows: (N,) long, the sequence of each token (a sequence's tokens
    are contiguous and in order). P_t = sum of |A_s| over the earlier tokens of t's sequence (exclusive),
    S = max(sum over the sequence, epsilon): early tokens, before the student has drifted, weigh up to
    1 + gamma; the weight decays as the sequence accumulates disagreement with the teacher.
    """
    magnitude = advantages.detach().abs().double()
    if magnitude.numel() == 0:
        return torch.zeros(0, dtype=torch.float32, device=advantages.device)
    inclusive = magnitude.cumsum(0)
    number = int(rows.max()) + 1
    totals = torch.zeros(number, dtype=torch.float64, device=advantages.device).index_add_(0, rows, magnitude)
    before_row = totals.cumsum(0) - totals  # |A| of all earlier sequences
    prefix = inclusive - magnitude - before_row[rows]
    scale = totals.clamp_min(epsilon)[rows]
    return (1.0 + gamma * (1.0 - prefix / scale)).float()
