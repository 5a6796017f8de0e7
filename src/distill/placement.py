"""Where the teacher lives: a model on this machine, a server, a cache on disk, or the student itself.

    location   config                       signal it gives
    "model"    teacher (path, .gguf, hub)   dense (same tokenizer) or aligned (a method with cross_tokenizer)
    "server"   teacher_url                  sparse: top-k log-probs + the completion token's, over HTTP
    "cache"    teacher_cache                sparse, read from `distill cache-teacher` output; it scores only
                                            the completions it holds
    "self"     (a method with teacher=self) dense: the student's own weights (base / live / EMA) shown
                                            privileged context (`distill.teachers.self_teacher`)
    "none"     (a method with teacher=none) nothing: sft learns from the dataset's completions alone
A method works with a location when its objective consumes that location's signal kind. The first three
are the user's choice for any method with an external teacher; "self" and "none" are the method's.
"""

from __future__ import annotations

import urllib.parse

from distill.methods.registry import Method, Reads, get_method
from distill.models import DEFAULT_TEACHER
from distill.signals import ALIGNED, DENSE, SPARSE

MODEL, SERVER, CACHE, SELF, NONE = "model", "server", "cache", "self", "none"


def teacher_location(config) -> str:
    kind = get_method(config.method).teacher
    if kind != "external":
        return SELF if kind == "self" else NONE
    if config.teacher_cache is not None:
        return CACHE
    if config.teacher_url is not None:
        return SERVER
    return MODEL


def signal_kind(location: str, method: Method) -> str | None:
    if location == NONE:
        return None
    if location == SELF:
        return DENSE
    if location == MODEL:
        return ALIGNED if method.cross_tokenizer else DENSE
    return SPARSE


def is_remote(config) -> bool:
    return teacher_location(config) in (SERVER, CACHE)


READS = (
    Reads("a teacher model (no teacher_url / teacher_cache)", ("teacher",), lambda c: teacher_location(c) == MODEL),
    Reads("a server or cache teacher", ("teacher_logprobs",), is_remote),
    Reads("teacher_url (a server teacher)", ("teacher_url", "teacher_model_name", "teacher_concurrency",
                                             "teacher_request_size", "teacher_timeout", "teacher_retries"),
          lambda c: teacher_location(c) == SERVER),
    Reads("teacher_cache", ("teacher_cache",), lambda c: teacher_location(c) == CACHE),
)


def validate(config, method: Method, sources: frozenset[str]) -> None:
    """The teacher's location against the method (its objective's signals, its completion sources)."""
    if method.teacher != "external":
        _no_external_teacher(config, method)
        return
    if config.teacher_url is not None and config.teacher_cache is not None:
        raise ValueError("teacher_url and teacher_cache: a run has one teacher location; set one of them")
    for name in ("teacher_url", "teacher_cache"):
        if getattr(config, name) is not None:
            parse_routes(getattr(config, name), name)
    for url in parse_routes(config.teacher_url, "teacher_url").values() if config.teacher_url is not None else ():
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"teacher_url must look like http://host:port (scheme and host), got {url!r}")
    location = teacher_location(config)
    kind = signal_kind(location, method)
    accepted = method.objective(config).signals
    if kind not in accepted:
        given = {DENSE: "a teacher model with the student's tokenizer", ALIGNED: "a teacher model with its own tokenizer",
                 SPARSE: f"sparse top-k log-probs from {'teacher_url' if location == SERVER else 'teacher_cache'}"}[kind]
        raise ValueError(f"method {method.name}'s objective takes {sorted(accepted)} teacher signals, and {given} gives "
                         f"{kind} ones; choose a teacher location the method can learn from")
    if location != MODEL and "teacher" in sources:
        raise ValueError("seq_kd: true needs a teacher that samples, and a server or cache teacher only scores. Set "
                         "seq_kd: false (dataset completions), or cache teacher-written completions with "
                         "`distill cache-teacher --generate` and train from teacher_cache")
    if location == CACHE and sources != frozenset({"dataset"}):
        raise ValueError("teacher_cache scores only the completions it holds, so every micro-batch must use them (nothing "
                         "can score new samples): set lmbda: 0, lmbda_schedule: constant and seq_kd: false")
    if location == CACHE and config.eval_before_after:
        raise ValueError("eval_before_after: a teacher cache cannot score new samples; set it to false and evaluate with "
                         "`distill eval RUN_DIR --teacher MODEL`")
    for name in ("teacher_logprobs", "teacher_concurrency", "teacher_request_size"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
    if not config.teacher_timeout > 0 or config.teacher_retries < 0:
        raise ValueError("teacher_timeout must be > 0 and teacher_retries >= 0")


def parse_routes(value: str, name: str) -> dict[str, str]:
    """'target' -> {"": target}; 'a=target,b=target' -> {"a": ..., "b": ...} (teachers routed by teacher_id)."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if len(parts) == 1 and "=" not in parts[0].split("://")[0]:
        return {"": parts[0]}
    routes = {}
    for part in parts:
        key, sep, target = part.partition("=")
        if not sep or not key.strip() or not target.strip() or "://" in key:
            raise ValueError(f"{name}: expected one target or 'id=target,id=target', got {value!r}")
        if key.strip() in routes:
            raise ValueError(f"{name}: teacher id {key.strip()!r} appears twice")
        routes[key.strip()] = target.strip()
    if not routes:
        raise ValueError(f"{name} is empty")
    return routes


def _no_external_teacher(config, method: Method) -> None:
    """A self-teacher or teacher-free method: every external teacher field is an error that says why."""
    why = ("its teacher is the student itself, shown privileged context" if method.teacher == "self"
           else "it learns from the dataset's completions and has no teacher")
    for name in ("teacher_url", "teacher_cache"):
        if getattr(config, name) is not None:
            raise ValueError(f"{name}: method {method.name} takes no external teacher ({why}); remove {name}")
    if config.teacher != DEFAULT_TEACHER:
        raise ValueError(f"teacher: method {method.name} takes no teacher model ({why}); remove teacher and name the "
                         "model to train as student")
