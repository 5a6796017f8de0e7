"""The student's side of the loss: from a micro-batch and a teacher signal to the loss sum.

Only the positions that predict completion tokens reach the student's lm_head (a prompt position is never
projected to the vocabulary). This runs inside `StudentObjective.forward`, so a DDP/FSDP wrapper from
accelerate sees the whole computation: FSDP gathers the lm_head weight there, DDP's gradient hooks see
every parameter. Which divergence is computed is the signal's business (`distill.teachers`).
"""

from __future__ import annotations

import torch
from torch import nn

from distill.losses import DistillLoss
from distill.models import logit_head
from distill.teachers import (
    LossSettings,
    TeacherSignal,
    backbone_hidden,
    completion_targets,
    predicting_positions,
)


def student_loss(student: nn.Module, vocab_size: int, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 completion_mask: torch.Tensor, signal: TeacherSignal, settings: LossSettings) -> DistillLoss:
    """Loss sum of `student` against `signal` on the completion tokens of a (B, T) micro-batch."""
    hidden = backbone_hidden(student, input_ids, attention_mask)
    student_hidden = hidden[:, :-1][predicting_positions(completion_mask)]
    head = logit_head(student, vocab_size)
    # The loss manages its own precision (fp32 accumulation); autocast must not touch its matmuls.
    with torch.autocast(device_type=student_hidden.device.type, enabled=False):
        return signal.to(student_hidden.device).loss(student_hidden, head, completion_targets(input_ids, completion_mask), settings)


class StudentObjective(nn.Module):
    """Wraps the student so that forward returns the distillation loss sum of a micro-batch."""

    def __init__(self, student: nn.Module, vocab_size: int):
        super().__init__()
        self.student = student
        self.vocab_size = vocab_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor,
                signal: TeacherSignal, settings: LossSettings) -> DistillLoss:
        return student_loss(self.student, self.vocab_size, input_ids, attention_mask, completion_mask, signal, settings)
