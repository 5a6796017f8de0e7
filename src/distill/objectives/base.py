"""What an objective sees and returns.

An objective turns the student's view of a micro-batch (`StudentTokens`) and a teacher signal
(`distill.signals`) into a `DistillLoss` of sums (never means): the trainer owns the denominator, the
completion tokens of the whole optimizer step on every process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from distill.losses import DistillLoss, LogitHead


@dataclass
class StudentTokens:
    """The student at the N completion-predicting positions of a micro-batch, in row-major order.

    hidden: (N, H) last hidden states; head: the student's lm_head; targets: (N,) long, the completion
    token each position predicts; rows: (N,) long, the micro-batch row of each position (None when no
    objective needs it);
    rollout_log_probs: (N,) float32, the log-prob each token had under the policy that sampled it
    (recorded at generation, `distill.rollout`), or None when the method does not ask for them.
    """

    hidden: torch.Tensor
    head: LogitHead
    targets: torch.Tensor
    rows: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> "StudentTokens":
        """The positions `index` (M,) long, in that order (one teacher's share of a routed micro-batch)."""
        pick = lambda values: None if values is None else values.index_select(0, index)  # noqa: E731
        return StudentTokens(pick(self.hidden), self.head, pick(self.targets), pick(self.rows), pick(self.rollout_log_probs))


@dataclass(frozen=True)
class StepContext:
    """Per micro-batch facts an objective may need: its completion source, and whether this optimizer step
    logs (then per-token diagnostics are computed)."""

    source: str
    return_stats: bool = False


class Objective(Protocol):
    """signals: the signal kinds (`distill.signals.DENSE`, ...) the objective can consume."""

    signals: frozenset[str]

    def __call__(self, tokens: StudentTokens, signal, context: StepContext) -> DistillLoss: ...
