"""Divergence losses for distillation.

- `generalized_jsd_loss`: dense, on full logits; the reference library's signature and values.
- `chunked_generalized_jsd`: the same math from hidden states, block by block (what training uses).
- `sparse_generalized_jsd`: against a teacher that only gives its top-k log-probs, with a tail bucket.
- `all_reduce_sum`: the one cross-process reduction (metrics are token-weighted: `distill.training.metrics`).
- `divergence_diagnostics`, `TokenStats`: per-token entropies, KLs, top-1 agreement, top-k overlap.
"""

from distill.losses.chunked import (
    DEFAULT_CHUNK_SIZE,
    DistillLoss,
    LogitHead,
    chunked_generalized_jsd,
)
from distill.losses.diagnostics import STAT_NAMES, TokenStats, divergence_diagnostics
from distill.losses.divergence import generalized_jsd_loss
from distill.losses.reduce import all_reduce_sum
from distill.losses.sparse import coarse_generalized_jsd, sparse_generalized_jsd

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DistillLoss",
    "LogitHead",
    "STAT_NAMES",
    "TokenStats",
    "all_reduce_sum",
    "chunked_generalized_jsd",
    "coarse_generalized_jsd",
    "divergence_diagnostics",
    "generalized_jsd_loss",
    "sparse_generalized_jsd",
]
