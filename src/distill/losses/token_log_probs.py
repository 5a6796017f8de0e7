"""log softmax(z / T)[y] of given tokens from hidden states, chunked and without gradients.

One number per token, never a [tokens x vocab] tensor: a teacher's log-prob of a sampled token, a
recomputed sampling policy's, the student's log-probs of a group's inner tokens in ULD.
"""

from __future__ import annotations

import torch

from distill.losses.checks import check_chunk_size, check_temperature
from distill.losses.chunked import LogitHead, run_chunked


def token_log_probs(hidden: torch.Tensor, head: LogitHead, targets: torch.Tensor, temperature: float, chunk_size: int,
                    mask: torch.Tensor | None = None) -> torch.Tensor:
    """log softmax(head(hidden) / T)[targets] at the rows `mask` selects (all when None): (R,) float32.

    hidden: (N, H); targets: (N,) long; mask: (N,) bool or None.
    """
    rows_kept = hidden.shape[0] if mask is None else int(mask.sum())
    out = torch.zeros(rows_kept, dtype=torch.float32, device=hidden.device)

    def make_objective(valid_rows):
        row_targets = targets.index_select(0, valid_rows)

        def objective(rows, logits, need_grad):
            picked = logits.gather(1, row_targets[rows].unsqueeze(1)).squeeze(1)
            out[rows] = picked - logits.logsumexp(dim=-1)
            return torch.zeros(logits.shape[0], device=logits.device), None, None

        return objective

    with torch.no_grad():
        run_chunked(hidden, head, mask, make_objective, check_temperature(temperature), check_chunk_size(chunk_size), False)
    return out
