"""One teacher assembly, shared by training, `distill eval` and `distill cache-teacher`.

Each of them loads what it must (the student, the teacher model a location holds here) its own way, then
asks this module for the same two things: what the teacher is compared against (`comparison`: the
vocabulary both sides share, the end-of-completion ids, the pad id) and the location's teachers for a
purpose (`assemble_teachers`: TRAIN, EVAL or CACHE), kept whole as `Teachers` (train and eval).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from distill.locations import TeacherLocation, TeacherRequest, Teachers
from distill.methods.base import Method
from distill.models import eos_token_ids
from distill.teachers.build import comparison_vocab_size

if TYPE_CHECKING:
    from distill.config import DistillConfig


@dataclass(frozen=True)
class Comparison:
    """What a teacher is built against: vocab_size (the vocabulary both models are compared over), eos_ids
    (the tokens that end a completion, the one appended to dataset and teacher completions first), pad_id."""

    vocab_size: int
    eos_ids: list[int]
    pad_id: int


def comparison(method: Method, tokenizer: Any, student: nn.Module | None, teacher: nn.Module | None = None,
               teacher_tokenizer: Any = None) -> Comparison:
    """The comparison of `tokenizer`'s side (the student's; for a cache, the tokenizer the cache is for) with
    the teacher's. `teacher` None: the teacher is outside the process (a server, a cache, the student itself),
    its vocabulary checked against the student's elsewhere. `student` None (a cache): the teacher model is the
    reference; with neither, the tokenizer's own size. A tokenizer without a pad token pads with its EOS."""
    for each in (tokenizer, teacher_tokenizer):
        if each is not None and each.pad_token_id is None:
            each.pad_token = each.eos_token
    reference = student if student is not None else teacher
    if reference is None:
        vocab = len(tokenizer)
    else:
        vocab = comparison_vocab_size(method.cross_tokenizer, tokenizer, teacher_tokenizer if teacher is not None else tokenizer,
                                      reference, teacher if teacher is not None else reference)
    return Comparison(vocab, eos_token_ids(tokenizer, reference), tokenizer.pad_token_id)


def assemble_teachers(location: TeacherLocation, purpose: str, config: DistillConfig, method: Method, tokenizer: Any,
                      against: Comparison, device: Any, **request: Any) -> Teachers:
    """The location's teachers for `purpose`, built against `against` (`TeacherRequest`'s other fields in
    `request`: probe_ids, temperature, teacher_model, teacher_tokenizer, student, rows)."""
    return location.build(TeacherRequest(config, method, purpose, tokenizer, against.vocab_size, against.eos_ids,
                                         against.pad_id, device, **request))
