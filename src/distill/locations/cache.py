"""The teacher is a cache on disk (`teacher_cache`: `distill cache-teacher` output, several routed by
teacher_id): sparse top-k log-probs of the completions it holds, or (`teacher_payload: hidden`) the teacher's
hidden states and head, which give the exact full distribution; its completions replace the dataset's own. It
cannot score new samples, so every micro-batch must use its completions and nothing evaluates against it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.locations.base import TeacherRequest, Teachers
from distill.locations.external import NOT_EVALUABLE
from distill.locations.registry import location_of
from distill.locations.remote import RemoteLocation, hidden_payload
from distill.locations.routes import parse_routes
from distill.methods.base import Method, get_method
from distill.registry import Reads
from distill.settings.locations import CacheFields, RemoteTeacherFields
from distill.teachers.build import check_routes, one_or_routed, use_cached_completions
from distill.teachers.cache import TeacherCache
from distill.teachers.offline import OfflineTeacher

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.teachers.base import Teacher


class CacheLocation(RemoteLocation):
    name = "cache"
    reads_images = True  # the cache's teacher read them when it was written; its key holds their digests
    fields = (CacheFields, RemoteTeacherFields)
    field = "teacher_cache"
    scores_ahead = True
    selected_by = ("teacher_cache", "cache-directory",
                   ({"lmbda": 0.0, "lmbda_schedule": "constant", "seq_kd": False, "eval_before_after": False},))

    def __init__(self) -> None:
        def here(config: DistillConfig) -> bool:
            return location_of(config, get_method(config.method)) is self

        self.reads = (Reads("a server or cache teacher", ("teacher_payload",), here),
                      Reads("a server or cache teacher with teacher_payload: topk", ("teacher_logprobs",),
                            lambda c: here(c) and not hidden_payload(c)),
                      Reads("teacher_cache", ("teacher_cache",), here))

    def claims(self, config: DistillConfig, method: Method) -> bool:
        return method.teacher == "external" and CacheFields.of(config).teacher_cache is not None

    def card_teacher(self, record: dict) -> str:
        return f"the teacher cache {record['teacher_cache']}"

    def inputs(self, config: DistillConfig) -> dict[str, str]:
        return {f"teacher_cache {tid}".strip(): path for tid, path in _routes(config).items()}

    def validate(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        _routes(config)
        super().validate(config, method, sources)
        if sources != frozenset({"dataset"}):
            raise ValueError("teacher_cache scores only the completions it holds, so every micro-batch must use them "
                             "(nothing can score new samples): set lmbda: 0, lmbda_schedule: constant and seq_kd: false")
        if config.eval_before_after:
            raise ValueError("eval_before_after: a teacher cache cannot score new samples; set it to false and evaluate "
                             "with `distill eval RUN_DIR --teacher MODEL`")

    def check_dataset(self, config: DistillConfig, method: Method, possible_sources: frozenset[str], examples: list) -> None:
        pass  # the cache's completions replace the dataset's (`build`)

    def build(self, request: TeacherRequest) -> Teachers:
        config = request.config
        teachers: dict[str, Teacher] = {}
        for tid, directory in _routes(config).items():
            cache = TeacherCache(directory)
            remote = RemoteTeacherFields.of(config)
            cache.check_run(request.tokenizer, remote.teacher_logprobs, config.temperature, config.max_prompt_length,
                            config.max_new_tokens, remote.teacher_payload)
            if cache.head is not None and cache.head.vocab_size != request.vocab_size:
                raise ValueError(f"teacher_cache {directory}: its teacher head has {cache.head.vocab_size} rows, the student's "
                                 f"vocabulary {request.vocab_size}")
            teachers[tid] = OfflineTeacher(cache)
        teacher = one_or_routed(teachers, request.pad_id)
        check_routes(teacher, request.examples + request.eval_examples)
        use_cached_completions(teacher, request.examples, request.encoded)
        return Teachers(teacher, teacher)

    def check_evaluable(self, config: DistillConfig) -> None:
        raise ValueError(NOT_EVALUABLE)


def _routes(config: DistillConfig) -> dict[str, str]:
    """The teacher ids and their caches' directories (`parse_routes` of teacher_cache, which `claims` found set)."""
    teacher_cache = CacheFields.of(config).teacher_cache
    assert teacher_cache is not None  # the location claims only runs that set it
    return parse_routes(teacher_cache, "teacher_cache")
