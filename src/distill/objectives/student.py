"""The student's side of every objective: from a micro-batch to `StudentTokens`, then the method's loss.

Only the positions that predict completion tokens reach the student's lm_head (a prompt position is never
projected to the vocabulary). This runs inside `StudentObjective.forward`, so a DDP/FSDP wrapper from
accelerate sees the whole computation: FSDP gathers the lm_head weight there, DDP's gradient hooks see
every parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from distill.batch import MicroBatch
from distill.losses import DistillLoss
from distill.models import logit_head
from distill.objectives.base import Objective, StepContext, StudentTokens
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)


def student_tokens(student: nn.Module, vocab_size: int, batch: MicroBatch) -> StudentTokens:
    """The student's hidden states at the completion-predicting positions of `batch` (B, T)."""
    hidden = backbone_hidden(student, batch.input_ids, batch.attention_mask, batch.extras)
    positions = predicting_positions(batch.completion_mask)
    rows = torch.arange(positions.shape[0], device=positions.device).unsqueeze(1).expand_as(positions)[positions]
    rollout, advantages, turns = batch.rollout_log_probs, batch.advantages, batch.turns
    return StudentTokens(hidden[:, :-1][positions], logit_head(student, vocab_size),
                         completion_targets(batch.input_ids, batch.completion_mask), rows,
                         None if rollout is None else rollout.to(hidden.device, torch.float32),
                         None if advantages is None else advantages.to(hidden.device, torch.float32)[rows],
                         turns=None if turns is None else turns.to(hidden.device))


def student_loss(student: nn.Module, vocab_size: int, batch: MicroBatch, signal, objective: Objective,
                 context: StepContext) -> DistillLoss:
    """`objective`'s loss sum for `student` against `signal` (None for a method without a teacher) on the
    completion tokens of `batch`."""
    tokens = student_tokens(student, vocab_size, batch)
    # The loss manages its own precision (fp32 accumulation); autocast must not touch its matmuls.
    with torch.autocast(device_type=tokens.hidden.device.type, enabled=False):
        return objective(tokens, None if signal is None else signal.to(tokens.hidden.device), context)


class StudentObjective(nn.Module):
    """Wraps the student so that forward returns the method's loss sum of a micro-batch."""

    def __init__(self, student: nn.Module, vocab_size: int):
        super().__init__()
        self.student = student
        self.vocab_size = vocab_size

    def forward(self, batch: MicroBatch | None = None, signal=None, objective: Objective | None = None,
                context: StepContext | None = None, *, run=None):
        """The loss sum of `batch`; or, given `run`, `run(student)` (under FSDP this is how generation and
        evaluation reach the gathered student: `distill.models.sharding.gathered`)."""
        if run is not None:
            return run(self.student)
        assert batch is not None and objective is not None and context is not None  # a loss call passes them
        return student_loss(self.student, self.vocab_size, batch, signal, objective, context)
