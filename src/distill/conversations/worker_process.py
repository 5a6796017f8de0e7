"""The inside of a tool worker: a process that imports tools and environment factories by import path and runs what
the trainer asks, one request at a time (the trainer's side is `distill.conversations.workers`).

A request is a tuple: ("call", spec, arguments) runs the tool `spec` names; ("make", key, spec, row) makes an
environment instance with the factory `spec` names and calls its `reset(**row)`; ("method", key, name, arguments)
calls the instance's method; ("reward", key) its `get_reward()`; ("drop", keys) forgets instances (no reply). Each
answer is a `Reply`. What a tool returns crosses back only as text (a string, or a number written as text): anything
else, or a text longer than `MAX_RESULT_CHARS`, is a failure decided here, so no object of the user's is unpickled in
the trainer. A failure the worker survives (an exception, `sys.exit`, a MemoryError, a result that is not text) is a
reply; one it does not (a timeout, `os._exit`, a signal) is noticed by the trainer, which knows the process is gone.

Kept light: it imports nothing of distill beyond `distill.callables`, so a worker starts in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import inspect
import numbers
import os
import signal
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from distill.callables import import_callable

MAX_RESULT_CHARS = 1 << 20  # a longer result fits no completion budget; it is refused before it crosses the pipe


@dataclass(frozen=True)
class Reply:
    """What a request gave: `failure`: None, or its kind (`distill.conversations.tools.FAILURES`); `text`: the result
    (a tool's text, a made instance's observation, a reward's repr) or, for a failure, what the message says about
    it; `value`: a reward's number; `names`: a made instance's methods (its tools)."""

    failure: str | None
    text: str | None
    seconds: float = 0.0
    value: float | None = None
    names: tuple[str, ...] = ()
    where: str = ""  # what of an environment failed: "factory", "reset" or "get_reward"
    process: int | None = None  # which of its slot's processes answered (`workers.WorkerPool` fills it in)


def _call(function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    result = function(**arguments)
    if inspect.isawaitable(result):
        async def waited() -> Any:
            return await result

        result = asyncio.run(waited())
    return result


def _attempt(function: Callable[..., Any], arguments: dict[str, Any]) -> tuple[Any, Reply | None]:
    """(what `function(**arguments)` returned, None), or (None, the failure's reply)."""
    started = time.perf_counter()
    try:
        return _call(function, arguments), None
    except SystemExit as error:
        return None, Reply("exited", f"sys.exit({_said(error.code, repr)})", time.perf_counter() - started)
    except MemoryError as error:
        return None, Reply("out_of_memory", _described(error), time.perf_counter() - started)
    except TypeError as error:
        if _raised_by_the_call(error):  # the arguments do not fit the signature
            return None, Reply("bad_arguments", _said(error, str), time.perf_counter() - started)
        return None, Reply("raised", _described(error), time.perf_counter() - started)
    except BaseException as error:  # noqa: BLE001  (anything a tool raises is its result, KeyboardInterrupt included)
        return None, Reply("raised", _described(error), time.perf_counter() - started)


def _raised_by_the_call(error: TypeError) -> bool:
    """Whether `error` was raised binding the arguments (in `_call`'s own frame, no frame of the tool's below it)."""
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    return traceback is not None and traceback.tb_frame.f_code is _call.__code__


def _said(thing: Any, how: Callable[[Any], str]) -> str:
    """`how(thing)`, or a placeholder when the user's object cannot say itself."""
    try:
        return how(thing)[:MAX_RESULT_CHARS]
    except Exception:  # noqa: BLE001  (a __str__ / __repr__ that raises)
        return f"<{type(thing).__name__} that cannot be shown>"


def _described(error: BaseException) -> str:
    said = _said(error, str)
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


def _as_text(value: Any, seconds: float) -> Reply:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return Reply("not_text", type(value).__name__, seconds)
    text = str(value)
    if len(text) > MAX_RESULT_CHARS:
        return Reply("too_long", f"{len(text):,} characters (at most {MAX_RESULT_CHARS:,})", seconds)
    return Reply(None, text, seconds)


def _run(function: Callable[..., Any], arguments: dict[str, Any]) -> Reply:
    started = time.perf_counter()
    value, failed = _attempt(function, arguments)
    return failed if failed is not None else _as_text(value, time.perf_counter() - started)


def public_methods(kind: type) -> list[str]:
    """An environment class's tools: its public methods (listed on the class, so properties are not evaluated),
    `reset` and `get_reward` aside."""
    return [name for name, _ in inspect.getmembers(kind, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")]


class Worker:
    """The worker's state: the tools it imported (by spec) and the environment instances it holds (by key)."""

    def __init__(self) -> None:
        self.callables: dict[str, Callable[..., Any]] = {}
        self.instances: dict[int, Any] = {}

    def imported(self, spec: str, field: str) -> Callable[..., Any]:
        if spec not in self.callables:
            self.callables[spec] = import_callable(spec, field)
        return self.callables[spec]

    def answer(self, request: tuple) -> Reply | None:
        kind = request[0]
        if kind == "call":
            _, spec, arguments = request
            return _run(self.imported(spec, "tools"), arguments)
        if kind == "make":
            return self.make(*request[1:])
        if kind == "method":
            _, key, name, arguments = request
            return _run(getattr(self.instances[key], name), arguments)
        if kind == "reward":
            return self.reward(request[1])
        if kind == "drop":
            for key in request[1]:
                self.instances.pop(key, None)
            return None
        raise ValueError(f"a tool worker got an unknown request {kind!r}")

    def make(self, key: int, spec: str, row: dict[str, Any]) -> Reply:
        """The instance made and reset: its reply holds the observation and the instance's methods."""
        instance, failed = _attempt(self.imported(spec, "environment"), {})
        if failed is not None:
            return replace(failed, where="factory")
        observation, failed = _attempt(instance.reset, row)
        if failed is not None:
            return replace(failed, where="reset")
        if observation is not None and not isinstance(observation, str):
            return Reply("not_text", type(observation).__name__, where="reset")
        self.instances[key] = instance
        return Reply(None, observation, names=tuple(public_methods(type(instance))))

    def reward(self, key: int) -> Reply:
        value, failed = _attempt(self.instances[key].get_reward, {})
        if failed is not None:
            return replace(failed, where="get_reward")
        if isinstance(value, numbers.Real):
            return Reply(None, _said(value, repr), value=float(value), where="get_reward")
        return Reply("not_text", _said(value, repr), where="get_reward")


def _guard_against_orphaning(parent: int) -> None:
    """Die with the trainer: the kernel's parent-death signal where there is one (Linux), and a thread that checks
    the parent every second (a tool that holds the GIL in C code delays only the latter)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: SIGKILL when the thread that started us ends
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=watch, name="distill-orphan-guard", daemon=True).start()


def serve(connection: Any, parent: int, memory_limit: int | None, preload: list[tuple[str, str]]) -> None:
    """Answer requests from `connection` until the trainer closes it (or dies); `memory_limit`: bytes of address space
    (RLIMIT_AS), None for none; `preload`: (import path, field) of the tools and factory to import first, before the
    worker says it is ready (an import's time is not a call's)."""
    _guard_against_orphaning(parent)
    if memory_limit is not None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    worker = Worker()
    for spec, field in preload:
        try:
            worker.imported(spec, field)
        except ValueError:  # the call that needs it says so
            pass
    connection.send("ready")
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return
        try:
            reply = worker.answer(request)
        except ValueError as error:  # a tool or factory that does not import: checked at start, so rare here
            reply = Reply("raised", f"{type(error).__name__}: {error}")
        if reply is not None:
            connection.send(reply)

