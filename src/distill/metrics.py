"""Training metrics: sums and counts accumulated over a logging window, reduced across processes once.

Every logged mean is sum(numerators) / sum(denominators) over all micro-batches and processes (float32
all-reduce), never a mean of means. Maxima are all-reduced with MAX.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist

from distill.losses import all_reduce_sum


class MetricWindow:
    """Named (numerator, denominator) pairs, maxima and plain sums for one logging window."""

    def __init__(self) -> None:
        self.pairs: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.maxima: dict[str, float] = defaultdict(float)
        self.sums: dict[str, float] = defaultdict(float)

    def add_mean(self, name: str, numerator: float, denominator: float) -> None:
        pair = self.pairs[name]
        pair[0] += float(numerator)
        pair[1] += float(denominator)

    def add_max(self, name: str, value: float) -> None:
        self.maxima[name] = max(self.maxima[name], float(value))

    def add_sum(self, name: str, value: float) -> None:
        self.sums[name] += float(value)

    def reduce(self, device: torch.device | str = "cpu") -> dict[str, float]:
        """Reduce across processes (tensors on `device`: NCCL cannot reduce CPU tensors). Every process must
        hold the same metric names: the trainer registers every name it may use before the first step."""
        mean_names = sorted(self.pairs)
        sum_names = sorted(self.sums)
        max_names = sorted(self.maxima)
        packed = torch.tensor(
            [v for n in mean_names for v in self.pairs[n]] + [self.sums[n] for n in sum_names], dtype=torch.float64, device=device
        )
        totals = all_reduce_sum(packed).tolist() if packed.numel() else []
        maxima = torch.tensor([self.maxima[n] for n in max_names], dtype=torch.float64, device=device)
        if maxima.numel() and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        result: dict[str, float] = {}
        for i, name in enumerate(mean_names):
            numerator, denominator = totals[2 * i], totals[2 * i + 1]
            if denominator > 0:
                result[name] = numerator / denominator
        offset = 2 * len(mean_names)
        for i, name in enumerate(sum_names):
            result[name] = totals[offset + i]
        for i, name in enumerate(max_names):
            result[name] = float(maxima[i])
        return result

    def register(self, means: list[str], sums: list[str], maxima: list[str]) -> None:
        """Create entries so every process reduces the same vector even if it never saw some source."""
        for name in means:
            self.pairs[name]
        for name in sums:
            self.sums[name]
        for name in maxima:
            self.maxima[name]


class MetricsLog:
    """Appends one JSON line per logging step to metrics.jsonl (main process only)."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def truncate_after(self, step: int) -> None:
        """On resume: drop lines logged after the checkpoint's step (they will be logged again)."""
        if not self.enabled or not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
