"""sft: supervised fine-tuning on the dataset's completions (cross-entropy), the baseline self-distillation
is measured against. No teacher; the same rollout, denominators, metrics and checkpoints as every method."""

from __future__ import annotations

from distill.methods.mixing import MixedSources
from distill.methods.registry import Method, Reads, register
from distill.objectives.supervised import CrossEntropyObjective

DATASET_ONLY = MixedSources(0.0)


register(Method(
    name="sft",
    summary="supervised fine-tuning: cross-entropy on the dataset's completions (the baseline of sdft)",
    paper=None,
    sources=lambda config: DATASET_ONLY,
    objective=lambda config: CrossEntropyObjective(config.loss_chunk_size),
    teacher="none",
    # The evaluation compares the student with its initial weights, shown each row's privileged context if any.
    reads=(Reads("eval_before_after: true (the evaluation's teacher is the initial model shown the row's context)",
                 ("teacher_prompt_template", "max_teacher_prompt_length"), lambda c: c.eval_before_after),),
    describe_loss=lambda record: "cross-entropy on the dataset's completions",
))
