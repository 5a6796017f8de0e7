"""A teacher's full next-token distribution reduced to what a sparse signal carries.

Used by everything that turns a teacher model into top-k log-probs: `distill serve-teacher` (answering
`prompt_logprobs`) and `distill cache-teacher` (writing shards). Chunked over positions, so a long batch
never holds more than [chunk x V] logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses import LogitHead
from distill.losses.blocks import logsumexp_rows
from distill.no_grad import no_grad


@dataclass
class TopK:
    """Per position (N of them): ids (N, K) long in decreasing probability; log_probs (N, K) float32;
    target_log_probs (N,) the log-prob of the token actually there; tail_log_probs (N,) the log of the
    mass outside {top-k} and that token (-inf when nothing is left). All at the given temperature."""

    ids: torch.Tensor
    log_probs: torch.Tensor
    target_log_probs: torch.Tensor
    tail_log_probs: torch.Tensor


@no_grad
def topk_log_probs(hidden: torch.Tensor, head: LogitHead, targets: torch.Tensor, k: int, temperature: float,
                   chunk_size: int = 256) -> TopK:
    """hidden: (N, H) at the positions predicting `targets` (N,); head: the teacher's lm_head."""
    n, vocab = hidden.shape[0], head.vocab_size
    if not 1 <= k <= vocab:
        raise ValueError(f"top-k must be between 1 and the vocabulary size {vocab}, got {k}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    parts: list[tuple[torch.Tensor, ...]] = []
    rows = min(max(n, 1), chunk_size)
    logits = torch.empty(rows, vocab, dtype=torch.float32, device=hidden.device)
    scratch = torch.empty_like(logits)
    for start in range(0, n, chunk_size):
        block_hidden, block_targets = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        c = block_hidden.shape[0]
        block, block_scratch = logits[:c], scratch[:c]
        head.project(block_hidden, temperature, block)
        block.sub_(logsumexp_rows(block, block_scratch).unsqueeze(1))  # log-probs, in place
        top_lp, top_ids = block.topk(k, dim=1)
        target_lp = block.gather(1, block_targets.unsqueeze(1)).squeeze(1)
        block.scatter_(1, top_ids, float("-inf"))
        block.scatter_(1, block_targets.unsqueeze(1), float("-inf"))
        parts.append((top_ids, top_lp.clone(), target_lp, logsumexp_rows(block, block_scratch)))
    if not parts:
        empty = torch.empty(0, k, device=hidden.device)
        return TopK(empty.long(), empty.float(), empty[:, 0].float(), empty[:, 0].float())
    ids, lps, target, tail = (torch.cat(p) for p in zip(*parts))
    return TopK(ids, lps, target, tail)
