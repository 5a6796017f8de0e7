"""Config rules shared by the methods whose teacher is the student itself (sdft, sdpo): the self-teacher's
kind and EMA, the self-distillation loss, num_iterations. Each raises ValueError
naming the field and the fix, before any model loads."""

from __future__ import annotations

import math

from distill.objectives.self_distillation import MODES
from distill.teachers.self_teacher import KINDS


def check_self_teacher(config) -> None:
    if config.teacher_model_kind not in KINDS:
        raise ValueError(f"teacher_model_kind must be one of {KINDS}, got {config.teacher_model_kind!r}")
    if not (0.0 < config.teacher_update_rate <= 1.0):
        raise ValueError(f"teacher_update_rate must be in (0, 1] (the student's share of each EMA update; 1 = copy the "
                         f"student), got {config.teacher_update_rate!r}")
    if config.teacher_sync_steps < 1:
        raise ValueError(f"teacher_sync_steps must be >= 1 (optimizer steps between EMA updates), got {config.teacher_sync_steps!r}")


def sampled_token_loss(config) -> list[str]:
    """The sampled-token loss's claim on sampling (`distill.methods.sampling_rules`), when it is the loss."""
    return ["distillation_mode sampled_token (REINFORCE on the student's samples)"] if config.distillation_mode == "sampled_token" else []


def check_distillation(config) -> None:
    if config.distillation_mode not in MODES:
        raise ValueError(f"distillation_mode must be one of {MODES}, got {config.distillation_mode!r}")
    if config.distillation_mode == "sampled_token" and config.beta != 1.0:
        raise ValueError(f"distillation_mode sampled_token estimates reverse KL on the sampled token only: set beta: 1 "
                         f"(got {config.beta}), or use full_logits / topk_logits for other betas")
    if config.distillation_topk < 1:
        raise ValueError(f"distillation_topk must be >= 1, got {config.distillation_topk!r}")
    if config.distillation_is_clip is not None and not (config.distillation_is_clip > 0 and math.isfinite(config.distillation_is_clip)):
        raise ValueError(f"distillation_is_clip must be a finite number > 0 (None: no cap), got {config.distillation_is_clip!r}")


def check_num_iterations(config) -> None:
    if config.num_iterations < 1:
        raise ValueError(f"num_iterations must be >= 1 (optimizer steps per generation batch), got {config.num_iterations!r}")
