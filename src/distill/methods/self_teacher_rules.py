"""Config rules shared by the methods whose teacher is the student itself (sdft, sdpo): the self-teacher's
kind and EMA, the self-distillation loss. Each raises ValueError naming the field and the fix, before any
model loads; a rule a part already checks (the teacher's kind, the loss's settings) is that part's check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.methods.self_teacher_fields import SelfTeacherFields
from distill.objectives.self_distillation import SelfDistillationSettings
from distill.teachers.self_teacher import check_kind

if TYPE_CHECKING:
    from distill.config import DistillConfig


def check_self_teacher(config: DistillConfig) -> None:
    self_teacher = SelfTeacherFields.of(config)
    check_kind(self_teacher.teacher_model_kind)
    if not (0.0 < self_teacher.teacher_update_rate <= 1.0):
        raise ValueError(f"teacher_update_rate must be in (0, 1] (the student's share of each EMA update; 1 = copy the "
                         f"student), got {self_teacher.teacher_update_rate!r}")
    if self_teacher.teacher_sync_steps < 1:
        raise ValueError(f"teacher_sync_steps must be >= 1 (optimizer steps between EMA updates), "
                         f"got {self_teacher.teacher_sync_steps!r}")


def sampled_token_loss(config: DistillConfig) -> list[str]:
    """The sampled-token loss's claim on sampling (`distill.methods.sampling_rules`), when it is the loss."""
    if SelfTeacherFields.of(config).distillation_mode == "sampled_token":
        return ["distillation_mode sampled_token (REINFORCE on the student's samples)"]
    return []


def check_distillation(config: DistillConfig) -> None:
    """The self-distillation loss's fields, checked by building its settings."""
    self_teacher = SelfTeacherFields.of(config)
    assert self_teacher.distillation_mode is not None and config.beta is not None  # validate() filled the method's defaults
    SelfDistillationSettings(self_teacher.distillation_mode, config.beta, topk=self_teacher.distillation_topk,
                             is_clip=self_teacher.distillation_is_clip)

