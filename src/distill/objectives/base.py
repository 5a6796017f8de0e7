"""What an objective sees and returns.

An objective turns the student's view of a micro-batch (`StudentTokens`) and a teacher signal
(`distill.signals`) into a `DistillLoss` of sums (never means): the trainer owns the denominator, the
completion tokens of the whole optimizer step on every process.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
    (recorded at generation, `distill.training.student_sampler`), or None when the method does not ask for them;
    advantages: (N,) float32, the advantage of each token's row (set by a method's step stage), or None;
    loss_weights: (N,) float32 constants weighting each token's loss (a stale sample's importance weights,
    `distill.objectives.staleness`), or None;
    turns: (N,) long, the model turn of its row each token belongs to (`distill.batch.model_turns`), or None.
    """

    hidden: torch.Tensor
    head: LogitHead
    targets: torch.Tensor
    rows: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    loss_weights: torch.Tensor | None = None
    turns: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> "StudentTokens":
        """The positions `index` (M,) long, in that order (one teacher's share of a routed micro-batch)."""
        pick = lambda values: None if values is None else values.index_select(0, index)  # noqa: E731
        return StudentTokens(pick(self.hidden), self.head, pick(self.targets), pick(self.rows), pick(self.rollout_log_probs),
                             pick(self.advantages), pick(self.loss_weights), pick(self.turns))


@dataclass(frozen=True)
class StepContext:
    """Per micro-batch facts an objective may need: its completion source, whether this optimizer step logs
    (then per-token diagnostics are computed), and the step's global sizes, for an objective whose loss has
    another denominator than the step's tokens (a policy loss normalised per sequence): it scales its sum by
    step_tokens / its own denominator, since the trainer divides every loss sum by step_tokens.

    step_tokens: trained completion tokens of the step, all micro-batches and processes; step_rows: rows
    with a trained token, likewise; step_micro_batches: micro-batches of the step over all processes;
    step_counts: the step's sums (all micro-batches and processes) of the counts the objective declares in its
    `step_counts` (sdpo: "distilled_tokens", the trained tokens of rows with a self-distillation loss, whose
    mean its distillation term is).

    staleness: optimizer steps between the student weights that sampled the micro-batch and the weights it
    trains (`MicroBatch.staleness`; 0 for dataset and teacher completions, k for the k-th reuse of a rollout).
    At 0 the sampling policy is the current one, so pi_theta / pi_old is 1 by definition: an objective takes
    pi_old from its own forward (detached) instead of the log-probs recorded at generation, which a
    reduced-precision training forward (bf16 autocast) would not reproduce exactly."""

    source: str
    return_stats: bool = False
    step_tokens: int = 0
    step_rows: int = 0
    step_micro_batches: int = 1
    step_counts: Mapping[str, int] = field(default_factory=dict)
    staleness: int = 0


class Objective(Protocol):
    """signals: the signal kinds (`distill.signals.DENSE`, ...) the objective can consume.
    step_counts (optional): name -> a count of a micro-batch the objective needs summed over the whole step,
    given back in `StepContext.step_counts` (none when the objective does not declare it)."""

    signals: frozenset[str]

    def __call__(self, tokens: StudentTokens, signal, context: StepContext) -> DistillLoss: ...
