"""Cross-entropy of given tokens from hidden states, chunked: supervised fine-tuning's loss (method sft).

    loss = sum_t -log softmax(z_t)[y_t],    d loss / d z_t = softmax(z_t) - onehot(y_t)

at temperature 1, a block of tokens at a time (`ChunkedHeadLoss`): the [tokens x vocab] logits never
exist at once, as for every other loss here.
"""

from __future__ import annotations

import torch

from distill.losses.checks import check_chunk_size, check_matrix
from distill.losses.chunked import DistillLoss, LogitHead, run_chunked


def chunked_cross_entropy(hidden: torch.Tensor, head: LogitHead, targets: torch.Tensor, chunk_size: int) -> DistillLoss:
    """Sum over the N tokens of -log p(target).

    hidden: (N, H), differentiable; head: the lm_head (weight (V, H), differentiable); targets: (N,) long.
    Returns DistillLoss(loss_sum, N, None).
    """
    check_matrix("hidden", hidden)
    if targets.shape != (hidden.shape[0],):
        raise ValueError(f"targets must have shape ({hidden.shape[0]},), got {tuple(targets.shape)}")

    def make_objective(valid_rows):
        row_targets = targets.index_select(0, valid_rows)

        def objective(rows, logits, need_grad):
            picked = row_targets[rows].unsqueeze(1)
            log_normaliser = logits.logsumexp(dim=-1)
            loss = log_normaliser - logits.gather(1, picked).squeeze(1)
            grad = None
            if need_grad:
                grad = logits.sub_(log_normaliser.unsqueeze(1)).exp_()
                grad.scatter_add_(1, picked, torch.full_like(picked, -1.0, dtype=grad.dtype))
            return loss, grad, None

        return objective

    return run_chunked(hidden, head, None, make_objective, 1.0, check_chunk_size(chunk_size), False)
