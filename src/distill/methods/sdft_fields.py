"""Config fields method sdft reads alone (read by `distill.methods.sdft`)."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting


@dataclass
class SdftFields(PartFields):
    missing_privileged_context: str = setting("error", "Training rows without privileged_context: 'error' (the run "
                                              "refuses them, naming the first) or 'skip' (they are sampled but get no "
                                              "loss and leave the denominator; the fraction is logged as "
                                              "self_teacher/rows_without_context).")
    num_loss_tokens_to_skip: int = setting(0, "The first this many tokens of every completion get no loss (and leave "
                                           "the denominator): the opening tokens are where the teacher prompt shows most.")
    generate_from_teacher: bool = setting(False, "The self-teacher samples the completions from its own prompt (with the "
                                          "privileged context); the student then learns on them from the bare prompt. "
                                          "Uses teacher_sampling_temperature / teacher_top_p / teacher_top_k.")
