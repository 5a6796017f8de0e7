"""Several teachers in one micro-batch: run an objective on each teacher's positions and merge the sums.

Any objective gets routing for free: `per_teacher` splits a `RoutedSignal` into its parts, calls the
objective's single-teacher loss on each part's positions, adds the sums, scatters the per-token
diagnostics back into position order and reports each teacher's loss as a group.
"""

from __future__ import annotations

from typing import Callable

import torch

from distill.losses import DistillLoss, TokenStats
from distill.objectives.base import StudentTokens
from distill.signals import RoutedSignal


def per_teacher(single: Callable[[StudentTokens, object], DistillLoss], tokens: StudentTokens, signal) -> DistillLoss:
    """`single(tokens, signal)` for a plain signal; for a routed one, merged over its parts."""
    if not isinstance(signal, RoutedSignal):
        return single(tokens, signal)
    n, device = tokens.hidden.shape[0], tokens.hidden.device
    loss_sum = tokens.hidden.new_zeros((), dtype=torch.float32)
    num_tokens = torch.zeros((), dtype=torch.long, device=device)
    stats: list[torch.Tensor] | None = None
    groups: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    metrics: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for tid, index, part in signal.parts:
        out = single(tokens.select(index), part)
        loss_sum = loss_sum + out.loss_sum
        num_tokens = num_tokens + out.num_tokens
        groups[tid] = (out.loss_sum.detach(), out.num_tokens)
        for name, (numerator, denominator) in (out.metrics or {}).items():
            previous = metrics.get(name, (0.0, 0.0))
            metrics[name] = (previous[0] + numerator, previous[1] + denominator)
        if out.stats is not None:
            if stats is None:
                stats = [torch.zeros(n, dtype=torch.float32, device=device) for _ in out.stats]
            for column, values in zip(stats, out.stats):
                column.index_copy_(0, index, values.float())
    return DistillLoss(loss_sum, num_tokens, TokenStats(*stats) if stats is not None else None, groups, metrics or None)
