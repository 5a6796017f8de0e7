"""The one cross-process reduction: a sum, in the tensor's dtype (the metrics window packs float64).

A mean of per-rank means weights a rank with 3 valid tokens as much as one with 3000; the reference library
logged such biased values (seed 000). Here every logged mean is sum(numerators) / sum(denominators) over all
processes (`distill.training.metrics.MetricWindow.reduce`), summed once with this function and divided once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum across processes when torch.distributed is initialised; the identity otherwise. Returns a new tensor."""
    tensor = tensor.detach().clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor
