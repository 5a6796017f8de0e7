"""The teacher is a model on this process (`teacher`: a directory, a .gguf file, a hub id, or a module
passed from Python): dense signals with the student's tokenizer, aligned ones with its own (a method with
`cross_tokenizer`). The fallback location: it holds the teacher when no other location claims it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from distill.locations.base import TeacherRequest, Teachers
from distill.locations.external import NOT_EVALUABLE, ExternalLocation
from distill.locations.registry import location_of
from distill.methods.base import Method, get_method
from distill.models import resolve_model_source
from distill.registry import Reads
from distill.signals import ALIGNED, DENSE
from distill.teachers.build import load_model, model_teacher

if TYPE_CHECKING:
    from distill.config import DistillConfig


class ModelLocation(ExternalLocation):
    name = "model"
    samples = True

    def __init__(self) -> None:
        self.reads = (Reads("a teacher model (no teacher_url / teacher_cache)", ("teacher",),
                            lambda config: location_of(config, get_method(config.method)) is self),)

    def claims(self, config: DistillConfig, method: Method) -> bool:
        return method.teacher == "external"

    def signal_kind(self, method: Method, config: DistillConfig) -> str:
        return ALIGNED if method.cross_tokenizer else DENSE

    def gives(self, method: Method, config: DistillConfig) -> str:
        return "a teacher model with its own tokenizer" if method.cross_tokenizer else "a teacher model with the student's tokenizer"

    def card_teacher(self, record: dict) -> str:
        return str(record["teacher"])

    def inputs(self, config: DistillConfig) -> dict[str, str]:
        return {"teacher": config.teacher}

    def check_arguments(self, config: DistillConfig, teacher, teacher_tokenizer) -> None:
        pass  # a teacher model object and its tokenizer are this location's to read

    def model_source(self, config: DistillConfig, teacher):
        source = teacher if teacher is not None else config.teacher
        if isinstance(source, str):
            resolve_model_source(source, "teacher")  # a missing path fails here, before anything loads
        return source

    def load_model(self, source, device, method: Method, teacher_tokenizer=None, tokenizer=None):
        if not isinstance(source, nn.Module):
            return load_model(source, "teacher", device)
        if teacher_tokenizer is None and method.cross_tokenizer:
            raise ValueError(f"teacher_tokenizer: method {method.name} distils across tokenizers; pass the teacher "
                             "model's own tokenizer as teacher_tokenizer")
        if (teacher_tokenizer or tokenizer) is None:
            raise ValueError("tokenizer: pass the tokenizer when the teacher is given as a model object")
        return source, teacher_tokenizer or tokenizer

    def build(self, request: TeacherRequest) -> Teachers:
        # A cross-tokenizer teacher checks both tokenizers' byte spans here.
        teacher = model_teacher(request.teacher_model, request.teacher_tokenizer, request.tokenizer,
                                cross_tokenizer=request.method.cross_tokenizer, vocab_size=request.vocab_size,
                                student_eos_ids=request.eos_ids, device=request.device,
                                max_prompt_length=request.config.max_prompt_length, uld_config=request.config)
        return Teachers(teacher, teacher)

    def check_evaluable(self, config: DistillConfig) -> None:
        if str(config.teacher).startswith("<"):  # a module passed from Python: config.yaml records only its type
            raise ValueError(NOT_EVALUABLE)
