"""Where a rollout's calls run: the run's tools and environment (`ToolCalls`), called in tool workers
(`distill.conversations.workers`), or answered by a stand-in while `standing_in` (how `distill doctor` times a step
without acting on anything).

`ToolCalls.open(rows)` begins a batch of conversations, one per row: with an environment, each row's instance is made
and reset in a host worker, where it stays for the whole conversation (rows are spread over the hosts in turn). A
round's calls then run at once (`Conversations.run`): a tool in any tool worker, a method of the row's environment in
the row's host. A tool's failure is a message (`distill.conversations.tools`) and the run goes on, its worker replaced
when the failure ended it. An environment whose host worker ended (a call past `tool_timeout`, `os._exit`, a crash)
has lost its instance, and with it every other instance that host held: their state is the calls made so far, which
cannot be replayed without running them again, so the step stops (`EnvironmentLost`: the trainer checkpoints and
prints the resume command). The run's plain tools run in workers of their own, so a failing tool never costs an
environment.
"""

from __future__ import annotations

import itertools
import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, cast

from distill.conversations.environments import EnvironmentFactory
from distill.conversations.tool_calls import ToolCall
from distill.conversations.tools import Tool, ToolResult, failed, failure_message, unknown
from distill.conversations.worker_process import Reply
from distill.conversations.workers import Job, WorkerPool
from distill.errors import EnvironmentLost, RewardFunctionError

STAND_IN = "(distill doctor did not run this tool; this text stands in for its result)"
_ENDS_WORKER = ("timeout", "exited", "crashed")  # failures that may have ended the worker (sys.exit does not)


class Conversations(Protocol):
    """A batch of conversations under way: `observations`, what each row's environment's reset said (None without)."""

    observations: list[str | None]

    def run(self, calls: list[tuple[int, ToolCall]]) -> list[ToolResult]:
        """The results of one round's calls, (row in the batch, call) each, in order; run at once."""
        ...

    def rewards(self) -> list[float]:
        """Each row's environment's `get_reward()` (an environment that owns a reward)."""
        ...

    def close(self) -> None:
        """The batch is done: its environments are dropped."""
        ...


class ToolCalls:
    """The run's `tools` (by name) and environment factory, each call given `timeout` seconds; `workers` tool workers
    for the tools and as many hosts for the environment's instances, each with `memory_limit` bytes of address
    space (None: no limit)."""

    def __init__(self, tools: dict[str, Tool], factory: EnvironmentFactory | None, timeout: float, workers: int,
                 memory_limit: int | None = None):
        self.tools, self.factory, self.timeout = tools, factory, timeout
        preload = tuple((tool.spec, "tools") for tool in tools.values()) + (
            ((factory.spec, "environment"),) if factory is not None else ())
        self.pool = WorkerPool(workers if factory is not None else 0, workers if tools else 0, memory_limit, preload)
        self._keys = itertools.count()
        self._standing_in = False

    @property
    def owns_reward(self) -> bool:
        return self.factory is not None and self.factory.owns_reward

    def open(self, rows: list[dict[str, Any]], indices: list[int]) -> Conversations:
        """A batch of conversations, one per row (`indices`: the rows' dataset indices, for messages)."""
        if self._standing_in:
            return StandIn(self, len(rows))
        return WorkerConversations(self, rows, indices)

    @contextmanager
    def standing_in(self) -> Iterator[None]:
        """While inside, no tool or environment is called: every call is answered `STAND_IN`, no environment is made
        (prompts show no observation) and an environment's reward is 0.0."""
        self._standing_in = True
        try:
            yield
        finally:
            self._standing_in = False

    def close(self) -> None:
        """End the workers (the run's end, or its failure); they start again if calls come."""
        self.pool.close()


@dataclass(frozen=True)
class _Instance:
    key: int
    host: int
    process: int | None  # the host's process that made it
    methods: frozenset[str]


class WorkerConversations:
    """Conversations whose calls run in the tool workers (module docstring)."""

    def __init__(self, calls: ToolCalls, rows: list[dict[str, Any]], indices: list[int]):
        self.calls, self.indices = calls, indices
        self.instances: list[_Instance] = []
        self.observations: list[str | None] = [None] * len(rows)
        factory = calls.factory
        if factory is None:
            return
        keys = [next(calls._keys) for _ in rows]
        hosts = [i % calls.pool.hosts for i in range(len(rows))]
        replies = calls.pool.run([Job(("make", key, factory.spec, row), host) for key, host, row in zip(keys, hosts, rows)],
                                 calls.timeout)
        self.instances = [_Instance(key, host, reply.process, frozenset(reply.names))
                          for key, host, reply in zip(keys, hosts, replies)]
        self._check_hosts([(row, _part(factory.spec, reply.where) if reply.where else f"{factory.spec}() and its reset", reply)
                           for row, reply in enumerate(replies)])
        for row, reply in zip(rows, replies):
            if reply.failure is not None:
                self.close()
                raise ValueError(f"environment: {_environment_failure(factory.spec, reply)} (called with the row's "
                                 f"columns {sorted(row)})")
        self.observations = [reply.text for reply in replies]

    def run(self, calls: list[tuple[int, ToolCall]]) -> list[ToolResult]:
        tools = self.calls.tools
        results: list[ToolResult | None] = []
        jobs, placed = [], []
        for row, call in calls:
            instance = self.instances[row] if self.instances else None
            if call.name in tools:
                jobs.append(Job(("call", tools[call.name].spec, call.arguments)))
            elif instance is not None and call.name in instance.methods:
                jobs.append(Job(("method", instance.key, call.name, call.arguments), instance.host))
            else:
                results.append(unknown(call.name, [*tools, *(instance.methods if instance else ())]))
                continue
            placed.append((len(results), row, call.name))
            results.append(None)
        replies = self.calls.pool.run(jobs, self.calls.timeout)
        for (at, _, name), reply in zip(placed, replies):
            results[at] = (ToolResult(name, reply.text or "", None, reply.seconds) if reply.failure is None
                           else failed(name, reply.failure, reply.text, reply.seconds))
        factory = self.calls.factory
        if factory is not None:
            self._check_hosts([(row, f"{factory.spec}.{name}", reply)
                               for (_, row, name), job, reply in zip(placed, jobs, replies) if job.host is not None])
        return cast(list[ToolResult], results)

    def rewards(self) -> list[float]:
        factory = self.calls.factory
        assert factory is not None
        replies = self.calls.pool.run([Job(("reward", instance.key), instance.host) for instance in self.instances],
                                      self.calls.timeout)
        self._check_hosts([(row, f"{factory.spec}.get_reward", reply) for row, reply in enumerate(replies)])
        values = []
        for index, reply in zip(self.indices, replies):
            if reply.failure is not None and reply.failure != "not_text":
                raise RewardFunctionError(f"environment: {_environment_failure(factory.spec, reply)} (dataset row "
                                          f"{index})")
            if reply.value is None or not math.isfinite(reply.value):
                raise RewardFunctionError(f"environment: {factory.spec}.get_reward returned {reply.text} for dataset row "
                                          f"{index}; it returns a finite number")
            values.append(reply.value)
        return values

    def close(self) -> None:
        for host in sorted({instance.host for instance in self.instances}):
            self.calls.pool.tell(host, ("drop", [i.key for i in self.instances if i.host == host]))
        self.instances = []

    def _check_hosts(self, ran: list[tuple[int, str, Reply]]) -> None:
        """`EnvironmentLost` when a host has lost the process that made one of the batch's instances; `ran`: (row, what
        of the environment ran, its reply) of the requests just run in the hosts, to say which one ended it."""
        pool = self.calls.pool
        lost = {i.host for i in self.instances if i.process is None or pool.incarnation(i.host) != i.process}
        if not lost:
            return
        held = sum(instance.host in lost for instance in self.instances)
        cause = next(((row, what, reply) for row, what, reply in ran
                      if reply.failure in _ENDS_WORKER and self.instances[row].host in lost), None)
        if cause is None:
            why = "ended between calls"
        else:
            row, what, reply = cause
            why = f"ended: {failure_message(what, reply.failure or '', reply.text)[len('error: '):]} (dataset row " \
                  f"{self.indices[row]})"
        pool.close()  # the batch's other instances go with it
        self.instances = []
        raise EnvironmentLost(f"environment: the tool worker holding {held} of the step's environment instances {why}; "
                              "an instance's state cannot be rebuilt mid-conversation, so the step stops. Keep a method's "
                              "work bounded inside the environment (run model-written code in a subprocess with a "
                              "timeout of its own), or raise tool_timeout")


def _part(spec: str, where: str) -> str:
    """The environment's function `where` names, as messages name it."""
    return {"factory": f"{spec}()", "reset": f"{spec}.reset", "get_reward": f"{spec}.get_reward"}.get(where, spec)


def _environment_failure(spec: str, reply: Reply) -> str:
    """What failed of an environment (its factory, reset or get_reward) and how, for a message."""
    if reply.failure == "not_text":
        return f"{_part(spec, reply.where)} returned {reply.text}; it returns None or text"
    return failure_message(_part(spec, reply.where), reply.failure or "", reply.text)[len("error: "):]


class StandIn:
    """Conversations whose calls nothing runs: a known tool's call is answered `STAND_IN`, an unknown one is an
    unknown_tool failure as always; no environment is made, its reward is 0.0."""

    def __init__(self, calls: ToolCalls, rows: int):
        self.observations: list[str | None] = [None] * rows
        self.rows = rows
        methods = [schema["function"]["name"] for schema in calls.factory.schemas] if calls.factory else []
        self.names = [*calls.tools, *methods]

    def run(self, calls: list[tuple[int, ToolCall]]) -> list[ToolResult]:
        return [ToolResult(call.name, STAND_IN, None, 0.0) if call.name in self.names else unknown(call.name, self.names)
                for _, call in calls]

    def rewards(self) -> list[float]:
        return [0.0] * self.rows

    def close(self) -> None:
        pass
