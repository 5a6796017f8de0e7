"""SOD's step-wise weights (Step-wise On-policy Distillation, arXiv 2605.07725): each step of a student's conversation
(one of its trained model turns) weighs its tokens' distillation loss by how far the student has drifted from the
teacher there, relative to the conversation's first step.

For a row with trained steps k = 1 .. K, each the tokens t of one model turn, with the sampled tokens' log-probs under
the student (log pi_theta) and the teacher (log pi_T):

    d_k = mean_{t in step k} |log pi_theta(y_t | s_t) - log pi_T(y_t | s_t)|
    w_1 = 1,   w_k = min( prod_{u=1}^{k-1} (d_u + eps) / (d_{u+1} + eps),  1 + delta )   (the paper's Eq. 7)

The product telescopes to (d_1 + eps) / (d_k + eps): a step the student has drifted further on than on its first is
weighed down (the teacher's signal there is less reliable), one closer to the teacher up to 1 + delta. Every token of
step k gets w_k. The weights are constants: no gradient flows through them (the paper computes them from the rollout's
log-probs, outside the loss's graph). The paper's code: `compute_stepwise_opd_weights` (github.com/YoungZ365/SOD), with
eps = 1e-6 and delta = 0.2 in its training script.
"""

from __future__ import annotations

import torch


def step_divergence_weights(gaps: torch.Tensor, rows: torch.Tensor, turns: torch.Tensor, epsilon: float,
                            delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights (N,) float32, step divergences d (N,) float32: each token's step's) from the tokens' gaps.

    gaps: (N,) |log pi_theta - log pi_T| of each trained token, in row-major order; rows: (N,) long, each token's row;
    turns: (N,) long, the model turn each token belongs to. A step is a run of tokens of one row and one turn (a
    row's tokens are contiguous and in turn order); a row's first step is its k = 1. Computed in float64."""
    n = gaps.shape[0]
    if not gaps.shape == rows.shape == turns.shape == (n,):
        raise ValueError(f"gaps, rows and turns must each have shape (N,), got {tuple(gaps.shape)}, {tuple(rows.shape)} "
                         f"and {tuple(turns.shape)}")
    if n == 0:
        return gaps.new_zeros(0, dtype=torch.float32), gaps.new_zeros(0, dtype=torch.float32)
    device = gaps.device
    new_row = torch.ones(n, dtype=torch.bool, device=device)
    new_row[1:] = rows[1:] != rows[:-1]
    new_step = new_row.clone()
    new_step[1:] |= turns[1:] != turns[:-1]
    step = new_step.long().cumsum(0) - 1  # (N,) each token's step, numbered over the micro-batch
    steps = int(step[-1]) + 1
    sums = torch.zeros(steps, dtype=torch.float64, device=device).index_add_(0, step, gaps.detach().double())
    counts = torch.zeros(steps, dtype=torch.float64, device=device).index_add_(0, step, torch.ones_like(sums[step]))
    divergence = sums / counts  # (S,) d of each step
    first = step[new_row]  # (R,) the first step of each row, in order
    first_of_step = first[new_row.long().cumsum(0)[new_step] - 1]  # (S,) each step's row's first step
    weights = ((divergence[first_of_step] + epsilon) / (divergence + epsilon)).clamp(max=1.0 + delta)
    weights[first] = 1.0  # w_1 = 1 exactly
    return weights[step].float(), divergence[step].float()
