"""Reductions: sums stay sums until one division at the end, across micro-batches and processes.

A mean of per-rank means weights a rank with 3 valid tokens as much as one with 3000; the reference library
logged such biased values (seed 000). Here every logged mean is sum(numerators) / sum(denominators) over all
processes, reduced in float32 whatever the dtype of the values (bf16 sums lose precision, and stacking a
bf16 numerator with a float32 count fails).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def masked_sum(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is true, in float32. values: any shape; mask: same shape (or None)."""
    values = values.float()
    if mask is None:
        return values.sum()
    if mask.shape != values.shape:
        raise ValueError(f"mask must have the shape of values {tuple(values.shape)}, got {tuple(mask.shape)}")
    return torch.where(mask.bool(), values, 0.0).sum()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum across processes when torch.distributed is initialised; the identity otherwise. Returns a new tensor."""
    tensor = tensor.detach().clone()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def global_masked_mean(values: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Token-weighted mean over every process: all-reduce (numerator, count) in float32, divide once.

    Args:
        values: any shape, any float dtype (detached: this is for metrics).
        mask: same shape, true where the value counts; None = all count.

    Returns:
        () float32; 0.0 when no process holds a valid value.
    """
    values = values.detach()
    numerator = masked_sum(values, mask)
    count = torch.tensor(float(values.numel()) if mask is None else float(mask.bool().sum()), device=values.device)
    totals = all_reduce_sum(torch.stack([numerator, count.float()]))
    return totals[0] / totals[1].clamp_min(1.0)
