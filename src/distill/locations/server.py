"""The teacher is a server (`teacher_url`: `distill serve-teacher` or stock vLLM, several routed by
teacher_id): sparse top-k log-probs over HTTP, or (`teacher_payload: hidden`: `distill serve-teacher`, or stock
vLLM's pooling runner) the teacher's hidden states with its head on the trainer, scored for the whole step in
one concurrent round."""

from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING

from distill.agents.setup import offered_schemas
from distill.locations.base import TeacherRequest, Teachers
from distill.locations.registry import location_of
from distill.locations.remote import HIDDEN_DTYPES, RemoteLocation, hidden_payload
from distill.locations.routes import parse_routes
from distill.methods.base import Method, get_method
from distill.models import load_tokenizer, resolve_model_source
from distill.registry import Reads
from distill.settings.locations import RemoteTeacherFields, ServerFields
from distill.signals import ALIGNED
from distill.teachers.build import (
    check_routes,
    hidden_server_teacher,
    one_or_routed,
    server_teacher,
)
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher, uld_settings
from distill.teachers.topk_client import ServerSettings

if TYPE_CHECKING:
    from distill.config import DistillConfig


class ServerLocation(RemoteLocation):
    name = "server"
    reads_images = True  # distill serve-teacher of a vision-language model (checked at the first request with images)
    fields = (ServerFields, RemoteTeacherFields)
    field = "teacher_url"
    scores_ahead = True
    selected_by = ("teacher_url", "http://127.0.0.1:8000", ({}, {"seq_kd": False}))

    def __init__(self) -> None:
        def here(config: DistillConfig) -> bool:
            return location_of(config, get_method(config.method)) is self

        self.reads = (
            Reads("a server or cache teacher", ("teacher_payload",), here),
            Reads("a server or cache teacher with teacher_payload: topk", ("teacher_logprobs",),
                  lambda c: here(c) and not hidden_payload(c)),
            Reads("teacher_payload: hidden with a server", ("teacher_head", "teacher_hidden_dtype"),
                  lambda c: here(c) and hidden_payload(c)),
            Reads("teacher_url (a server teacher)", ("teacher_url", "teacher_model_name", "teacher_concurrency",
                                                     "teacher_request_size", "teacher_timeout", "teacher_retries"), here),
        )

    def claims(self, config: DistillConfig, method: Method) -> bool:
        return method.teacher == "external" and ServerFields.of(config).teacher_url is not None

    def signal_kind(self, method: Method, config: DistillConfig) -> str:
        """Hidden states of a teacher with its own tokenizer are aligned here (gold); top-k log-probs cannot be."""
        if hidden_payload(config) and method.cross_tokenizer:
            return ALIGNED
        return super().signal_kind(method, config)

    def card_teacher(self, record: dict) -> str:
        return f"the teacher server {record['teacher_url']}"

    def validate(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        own = ServerFields.of(config)
        for url in _routes(own).values():
            parsed = urllib.parse.urlsplit(url)
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError(f"teacher_url must look like http://host:port (scheme and host), got {url!r}")
        if own.teacher_hidden_dtype not in HIDDEN_DTYPES:
            raise ValueError(f"teacher_hidden_dtype must be one of {HIDDEN_DTYPES}, got {own.teacher_hidden_dtype!r}")
        super().validate(config, method, sources)
        for name in ("teacher_concurrency", "teacher_request_size"):
            if getattr(own, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(own, name)!r}")
        if not own.teacher_timeout > 0 or own.teacher_retries < 0:
            raise ValueError("teacher_timeout must be > 0 and teacher_retries >= 0")
        if hidden_payload(config) and method.cross_tokenizer and own.teacher_head is None:
            raise ValueError(f"teacher_head: method {method.name} with a hidden-state server aligns the completions with the "
                             "teacher's own tokenizer: set teacher_head to the served teacher's directory (its tokenizer and "
                             "lm_head are read from there)")

    def build(self, request: TeacherRequest) -> Teachers:
        config, own = request.config, ServerFields.of(request.config)

        def one(url: str):
            settings = server_settings(config, url)
            if hidden_payload(config) and request.method.cross_tokenizer:
                return cross_tokenizer_server_teacher(settings, config, request)
            if hidden_payload(config):
                return hidden_server_teacher(settings, request.tokenizer, request.vocab_size, own.teacher_head,
                                             own.teacher_hidden_dtype)
            return server_teacher(settings, request.tokenizer, request.vocab_size, request.temperature, request.probe_ids)

        teachers = {tid: one(url) for tid, url in _routes(own).items()}
        teacher = one_or_routed(teachers, request.pad_id)
        check_routes(teacher, request.examples + request.eval_examples)
        return Teachers(teacher, teacher)

    def check_evaluable(self, config: DistillConfig) -> None:
        if list(_routes(ServerFields.of(config))) != [""]:
            raise ValueError("this run had several teacher servers: pass the one to score with as --teacher-url URL (or "
                             "--teacher MODEL)")


def _routes(own: ServerFields) -> dict[str, str]:
    """The teacher ids and their servers' URLs (`parse_routes` of teacher_url, which `claims` found set)."""
    assert own.teacher_url is not None  # the location claims only runs that set it
    return parse_routes(own.teacher_url, "teacher_url")


def cross_tokenizer_server_teacher(settings: ServerSettings, config: DistillConfig, request) -> CrossTokenizerTeacher:
    """A hidden-state server of a teacher with its own tokenizer (method gold): the tokenizer and the head come
    from `teacher_head`, the alignment and the group prefixes are computed here (`CrossTokenizerTeacher`)."""
    own = ServerFields.of(config)
    assert own.teacher_head is not None  # validate() requires it for a cross-tokenizer method
    teacher_tokenizer = load_tokenizer(resolve_model_source(own.teacher_head, "teacher_head"))
    remote = hidden_server_teacher(settings, teacher_tokenizer, len(teacher_tokenizer), own.teacher_head,
                                   own.teacher_hidden_dtype)
    settings_uld = uld_settings(config, request.tokenizer, teacher_tokenizer, request.vocab_size, len(teacher_tokenizer))
    return CrossTokenizerTeacher(None, teacher_tokenizer, request.tokenizer, request.eos_ids, config.max_prompt_length,
                                 settings_uld, request.device, remote=remote, offered_tools=offered_schemas(config),
                                 template_kwargs=config.teacher_template_kwargs())


def server_settings(config: DistillConfig, url: str) -> ServerSettings:
    """How to talk to the teacher server at `url`, as the run's config says (training and `distill eval` alike)."""
    own, remote = ServerFields.of(config), RemoteTeacherFields.of(config)
    return ServerSettings(url, remote.teacher_logprobs, own.teacher_model_name, own.teacher_concurrency,
                          own.teacher_request_size, own.teacher_timeout, own.teacher_retries)
