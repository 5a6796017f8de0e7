"""Config fields of the self-teacher and its loss (methods sdft and sdpo; checked by `distill.methods.self_teacher_rules`)."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting
from distill.methods.self_teacher_prompts import DEFAULT_TEACHER_PROMPT_TEMPLATE

SELF_TEACHER_KINDS = ("base", "live", "ema")
DISTILLATION_MODES = ("full_logits", "topk_logits", "sampled_token")


@dataclass
class SelfTeacherFields(PartFields):
    teacher_model_kind: str = setting("ema", f"The self-teacher: {SELF_TEACHER_KINDS}. 'base': the initial weights, frozen "
                                      "(a copy; with LoRA the adapter is switched off for the teacher pass, no copy). "
                                      "'live': the current weights, without gradient. 'ema': a moving average of the "
                                      "student's weights (a copy, saved in checkpoints), see teacher_update_rate.")
    teacher_update_rate: float = setting(0.05, "EMA self-teacher: theta_T <- (1 - r) theta_T + r theta_S every "
                                         "teacher_sync_steps optimizer steps. r in (0, 1] is the student's share: small r "
                                         "= a slow teacher, 1 = the teacher is reset to the student.")
    teacher_sync_steps: int = setting(1, "EMA self-teacher: optimizer steps between its updates.")
    teacher_prompt_template: str = setting(DEFAULT_TEACHER_PROMPT_TEMPLATE, "How the self-teacher sees a row: a template "
                                           "with {prompt} and {privileged_context} and no other placeholder (literal braces: "
                                           "{{ }}). A chat prompt keeps its turns; its last user turn becomes the filled-in "
                                           "template. The default shows the context as an example answer, then asks for "
                                           "the model's own (SDFT's).")
    max_teacher_prompt_length: int = setting(512, "Teacher prompts longer than this many tokens are truncated keeping "
                                             "their end (the fraction cut is logged as self_teacher/prompt_truncated).")
    distillation_mode: str | None = setting(None, f"Self-distillation loss: {DISTILLATION_MODES}; None: the method's "
                                     "default (listed below). 'full_logits': "
                                     "generalized JSD (beta) over the whole vocabulary. 'topk_logits': on the student's "
                                     "distillation_topk most likely tokens plus one tail bucket for the rest of each "
                                     "distribution's mass. 'sampled_token': reverse KL estimated on the sampled token "
                                     "(REINFORCE, advantage log pi_T - log pi_S; needs beta 1).")
    distillation_topk: int = setting(100, "distillation_mode topk_logits: the student's top-k tokens the divergence "
                                     "is computed on (plus the tail bucket).")
    distillation_is_clip: float | None = setting(2.0, "With num_iterations > 1: each token's loss is weighted by the "
                                                 "importance ratio pi_theta / pi_old of its sampled token, capped at this "
                                                 "value (None: uncapped).")
