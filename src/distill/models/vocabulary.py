"""The output layers two models are compared over: a model's head cut to the tokenizer's vocabulary, the shared
vocabulary of two models with one tokenizer (heads padded differently are aligned), a student's own."""

from __future__ import annotations

import logging

from torch import nn

from distill.losses import LogitHead

logger = logging.getLogger(__name__)


def logit_head(model: nn.Module, vocab_size: int) -> LogitHead:
    """The model's lm_head as a LogitHead over the first `vocab_size` rows (padded rows dropped).

    Reads the logit transforms some families use: Gemma's `final_logit_softcapping`, Cohere's
    `logit_scale` (a multiplier) and Granite's `logits_scaling` (a divisor).
    """
    head = model.get_output_embeddings()
    # A slice, even of all rows, costs its backward a zero-filled full-size copy of the gradient: cut only padding.
    cut = (lambda t: t[:vocab_size]) if head.weight.shape[0] != vocab_size else (lambda t: t)
    weight = cut(head.weight)
    bias = cut(head.bias) if getattr(head, "bias", None) is not None else None
    config = model.config
    scale = float(getattr(config, "logit_scale", None) or 1.0)
    if getattr(config, "logits_scaling", None):
        scale /= float(config.logits_scaling)
    softcap = getattr(config, "final_logit_softcapping", None)
    return LogitHead(weight, bias, scale, float(softcap) if softcap else None)


def shared_vocab_size(student_tokenizer, teacher_tokenizer, student: nn.Module, teacher: nn.Module) -> int:
    """The vocabulary both models are compared over; raises when the tokenizers differ.

    Embedding matrices are often padded past the tokenizer (to a multiple of 64 or 128), and two models
    sharing a tokenizer may be padded differently: both heads are then cut to the tokenizer's size.
    """
    if student_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ValueError(
            "tokenizer mismatch: the student and teacher tokenizers differ. Token-level distillation needs one "
            "shared vocabulary; for a teacher from another model family use cross-tokenizer distillation "
            "(method: gold)."
        )
    vocab = len(student_tokenizer)
    rows = {"student": student.get_output_embeddings().weight.shape[0], "teacher": teacher.get_output_embeddings().weight.shape[0]}
    for who, size in rows.items():
        if size < vocab:
            raise ValueError(f"the {who}'s lm_head has {size} rows but its tokenizer has {vocab} tokens")
    if rows["student"] != rows["teacher"] or rows["student"] != vocab:
        logger.info("vocabulary: aligning lm_heads (student %d rows, teacher %d rows) to the tokenizer's %d tokens",
                    rows["student"], rows["teacher"], vocab)
    return vocab


def check_rows_match(teacher: nn.Module, student: nn.Module) -> None:
    """A teacher model object passed without its tokenizer is taken to share the student's; that holds only if
    both output layers have the same rows. Otherwise the teacher would be cut to the student's rows and
    trained on in silence, so refuse."""
    rows = {who: model.get_output_embeddings().weight.shape[0] for who, model in (("teacher", teacher), ("student", student))}
    if rows["teacher"] != rows["student"]:
        raise ValueError(
            f"teacher_tokenizer: the teacher model has {rows['teacher']} vocabulary rows and the student {rows['student']}, "
            "so they may not share a tokenizer; pass teacher_tokenizer= (the teacher's own tokenizer) to have the "
            "vocabularies compared, or use method gold for a teacher with another tokenizer"
        )


def student_vocab_size(tokenizer, model: nn.Module) -> int:
    """The student's own vocabulary (cross-tokenizer runs compare no vocabularies): its tokenizer's size."""
    vocab, rows = len(tokenizer), model.get_output_embeddings().weight.shape[0]
    if rows < vocab:
        raise ValueError(f"the student's lm_head has {rows} rows but its tokenizer has {vocab} tokens")
    return vocab


