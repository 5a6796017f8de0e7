"""sft: supervised fine-tuning on the dataset's completions (cross-entropy), the baseline self-distillation
is measured against. No teacher; the same rollout, denominators, metrics and checkpoints as every method."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.methods.base import Method
from distill.methods.mixing import MixedSources
from distill.methods.self_teacher_fields import SelfTeacherFields
from distill.objectives.supervised import CrossEntropyObjective
from distill.registry import Reads

if TYPE_CHECKING:
    from distill.config import DistillConfig

DATASET_ONLY = MixedSources(0.0)


class SFT(Method):
    name = "sft"
    fields = (SelfTeacherFields,)
    summary = "supervised fine-tuning: cross-entropy on the dataset's completions (the baseline of sdft)"
    teacher = "none"
    template_fields = ("teacher_prompt_template",)  # sdft's, which sft is the baseline of (its evaluation teacher's too)
    # The evaluation compares the student with its initial weights, shown each row's privileged context if any.
    reads = (Reads("eval_before_after: true (the evaluation's teacher is the initial model shown the row's context)",
                   ("teacher_prompt_template", "max_teacher_prompt_length"), lambda c: c.eval_before_after),)

    def sources(self, config: DistillConfig):
        return DATASET_ONLY

    def objective(self, config: DistillConfig) -> CrossEntropyObjective:
        return CrossEntropyObjective(config.loss_chunk_size)

    def describe_loss(self, record: dict) -> str:
        return "cross-entropy on the dataset's completions"
