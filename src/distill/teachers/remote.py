"""Building the teacher of a run whose teacher is not a model on this machine (a server, a cache)."""

from __future__ import annotations

from distill.config import DistillConfig, parse_routes
from distill.teachers.cache import TeacherCache
from distill.teachers.offline import OfflineTeacher
from distill.teachers.routed import RoutedTeacher
from distill.teachers.server import ServerSettings, ServerTeacher


def build_remote_teacher(config: DistillConfig, tokenizer, vocab_size: int, pad_id: int, probe_ids: list[int]):
    """The run's server / offline teacher (routed by teacher_id when several), checked against the run.

    Everything that can be wrong with a teacher is found here, before training: an unreachable server, a
    server with another tokenizer or one that ignores the temperature, a cache of another tokenizer, K,
    temperature or prompt budget.
    """
    if config.teacher_cache is not None:
        routes = parse_routes(config.teacher_cache, "teacher_cache")
        teachers = {}
        for tid, directory in routes.items():
            cache = TeacherCache(directory)
            cache.check_run(tokenizer, config.teacher_logprobs, config.temperature, config.max_prompt_length,
                            config.max_new_tokens)
            teachers[tid] = OfflineTeacher(cache)
    else:
        routes = parse_routes(config.teacher_url, "teacher_url")
        teachers = {}
        for tid, url in routes.items():
            settings = ServerSettings(url, config.teacher_logprobs, config.teacher_model_name, config.teacher_concurrency,
                                      config.teacher_request_size, config.teacher_timeout, config.teacher_retries)
            teacher = ServerTeacher(settings, vocab_size)
            teacher.check(tokenizer)
            teacher.check_temperature(config.temperature, probe_ids)
            teachers[tid] = teacher
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


def teachers_of(teacher) -> dict[str, object]:
    return teacher.teachers if isinstance(teacher, RoutedTeacher) else {"": teacher}
