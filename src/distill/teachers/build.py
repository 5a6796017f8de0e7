"""Building teachers: the pieces the teacher locations (`distill.locations`) and `serve-teacher` build with.

- `load_model`: a teacher (or student) model and its tokenizer from a spec (directory, .gguf, hub id,
  smollm2-135m-instruct), float32, pad = EOS when the tokenizer has no pad token.
- `model_teacher`: a model on this process, same tokenizer (`LocalTeacher`) or its own (`CrossTokenizerTeacher`,
  for a method with `cross_tokenizer`).
- `server_teacher`: a server checked against the run before training: an unreachable server, another
  tokenizer, a server that ignores the temperature all fail here; `one_or_routed`: several teachers routed
  by teacher_id (the locations in `distill.locations` build servers and caches with these).
- `comparison_vocab_size`: the vocabulary the student's loss is computed over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import nn

from distill.agents.setup import offered_schemas
from distill.models import (
    load_causal_lm,
    load_processor,
    load_tokenizer,
    resolve_model_source,
    shared_vocab_size,
    student_vocab_size,
)
from distill.models.vision import is_vision_language
from distill.teachers.base import Teacher
from distill.teachers.cache import prompt_crc
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher, uld_settings
from distill.teachers.hidden_client import HiddenStateServerTeacher
from distill.teachers.local import LocalTeacher
from distill.teachers.offline import OfflineTeacher
from distill.teachers.routed import RoutedTeacher
from distill.teachers.topk_client import ServerSettings, ServerTeacher

if TYPE_CHECKING:
    pass


def load_model(spec: str, field: str = "teacher", device: torch.device | None = None, dtype: torch.dtype = torch.float32):
    """(model, tokenizer) for a model spec; the model in eval mode on `device` (CPU when None)."""
    source = resolve_model_source(spec, field)
    model = load_causal_lm(source, torch.float32, field).to(device or torch.device("cpu"), dtype)
    if is_vision_language(model):  # its tokenizer is its processor's; the processor is attached to the model
        return model.eval(), load_processor(source, model, field)
    return model.eval(), load_tokenizer(source)  # load_tokenizer sets pad = EOS when there is no pad token


def comparison_vocab_size(cross_tokenizer: bool, student_tokenizer, teacher_tokenizer, student: nn.Module, teacher: nn.Module) -> int:
    """Same tokenizer: the shared vocabulary (heads padded differently are cut to it; a mismatch is an error
    that names cross-tokenizer mode). Another tokenizer: the student's own."""
    if cross_tokenizer:
        return student_vocab_size(student_tokenizer, student)
    return shared_vocab_size(student_tokenizer, teacher_tokenizer, student, teacher)


def model_teacher(model: nn.Module, tokenizer, student_tokenizer, *, cross_tokenizer: bool, vocab_size: int,
                  student_eos_ids: list[int], device: torch.device, max_prompt_length: int, uld_config=None):
    """A teacher model on this process. `uld_config` (the gold fields) chooses plain or hybrid ULD across tokenizers."""
    if not cross_tokenizer:
        return LocalTeacher(model, vocab_size, student_eos_ids, student_tokenizer.pad_token_id, device)
    settings = uld_settings(uld_config, student_tokenizer, tokenizer, vocab_size, len(tokenizer))
    return CrossTokenizerTeacher(model, tokenizer, student_tokenizer, student_eos_ids, max_prompt_length, settings, device,
                                 offered_tools=offered_schemas(uld_config) if uld_config is not None else None,
                                 template_kwargs=uld_config.teacher_template_kwargs() if uld_config is not None else None)


def server_teacher(settings: ServerSettings, tokenizer, vocab_size: int, temperature: float, probe_ids: list[int]) -> ServerTeacher:
    """A server teacher checked against the student's tokenizer and the loss temperature."""
    teacher = ServerTeacher(settings, vocab_size)
    teacher.check(tokenizer)
    teacher.check_temperature(temperature, probe_ids)
    return teacher


def hidden_server_teacher(settings: ServerSettings, tokenizer, vocab_size: int, head_path: str | None,
                          dtype: str) -> HiddenStateServerTeacher:
    """A hidden-state server teacher checked against the student's tokenizer, with its head loaded and verified."""
    teacher = HiddenStateServerTeacher(settings, vocab_size, dtype)
    try:
        teacher.check(tokenizer, head_path)
    except BaseException:
        teacher.close()
        raise
    return teacher


def one_or_routed(teachers: dict[str, Teacher], pad_id: int) -> Teacher:
    """The only teacher of a run with one (its route is ""), or several routed by each row's teacher_id."""
    if list(teachers) == [""]:
        return teachers[""]
    return RoutedTeacher(teachers, pad_id)


def check_routes(teacher, examples) -> None:
    """Every example must name a configured teacher when several are configured."""
    if not isinstance(teacher, RoutedTeacher):
        return
    for example in examples:
        if example.teacher_id not in teacher.teachers:
            raise ValueError(f"dataset row {example.index}: teacher_id {example.teacher_id!r} is not one of the configured "
                             f"teachers {sorted(teacher.teachers)}; add a 'teacher_id' column naming one of them")


def teachers_of(teacher: Teacher | None) -> Mapping[str, Teacher | None]:
    return teacher.teachers if isinstance(teacher, RoutedTeacher) else {"": teacher}


def use_cached_completions(teacher, examples, encoded) -> None:
    """A cache teacher scores the completions it holds: they replace the examples' own (`encoded`, in place);
    their prompts must be the run's."""
    teachers = teachers_of(teacher)
    for example, one in zip(examples, encoded):
        one_teacher = teachers[example.teacher_id if len(teachers) > 1 else ""]
        assert isinstance(one_teacher, OfflineTeacher)  # a cache location's teachers
        cache = one_teacher.cache
        if example.index not in cache:
            raise ValueError(f"teacher_cache {cache.directory} has no entry for dataset row {example.index}: was it made "
                             "from this dataset and split?")
        if one.later:
            raise ValueError(f"teacher_cache {cache.directory}: dataset row {example.index} is a conversation trained in "
                             f"{len(one.later) + 1} pieces (its chat template re-renders its history), and a cache holds "
                             "one sequence per row; score it with a teacher model or server, or use a chat template "
                             "(chat_template_kwargs) that keeps earlier turns as they were")
        entry = cache.get(example.index)
        if entry.prompt_crc != prompt_crc(one.prompt_ids, example.images):
            raise ValueError(f"teacher_cache {cache.directory}: dataset row {example.index} has another prompt than the one "
                             "the cache scored (another dataset, split, chat template or chat_template_kwargs, "
                             "max_prompt_length, or other images?)")
        one.completion_ids = entry.tokens.tolist()
