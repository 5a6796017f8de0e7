"""The tools a rollout may call: Python callables named by import path, run with a per-call timeout.

A tool is a function of keyword arguments returning text (a number is written as text). Its JSON schema, shown to
the model, comes from its signature and docstring (transformers' `get_json_schema` where the docstring has an
`Args:` section, otherwise the parameter names and annotations). An `async def` tool runs in its own event loop.

Nothing a tool does stops the run: a call to a tool that does not exist, one whose arguments do not fit, one that
raises, runs past `tool_timeout` or returns something that is not text becomes an error message the model reads as
the tool's result, counted by kind (`FAILURES`). A timed-out call's thread cannot be killed; it is left to finish
in the background (a daemon thread) and its result is dropped.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from distill.callables import import_callable
from distill.conversations.tool_calls import ToolCall

FAILURES = ("unknown_tool", "malformed_call", "bad_arguments", "raised", "timeout", "not_text")
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class Tool:
    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back, as the conversation shows it; `failure`: its kind (`FAILURES`) or None."""

    name: str
    content: str
    failure: str | None
    seconds: float

    def message(self) -> dict[str, str]:
        """The result as a `tool` message of the conversation."""
        return {"role": "tool", "name": self.name or "tool", "content": self.content}


def tool_schema(function: Callable[..., Any]) -> dict[str, Any]:
    """The function's JSON schema in transformers' tool format."""
    try:
        from transformers.utils import get_json_schema

        return get_json_schema(function)
    except Exception:  # no `Args:` docstring, or a type it cannot describe: describe the signature only
        pass
    properties, required = {}, []
    for name, parameter in inspect.signature(function).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        kind = _JSON_TYPES.get(parameter.annotation) if parameter.annotation is not inspect.Parameter.empty else None
        properties[name] = {"type": kind} if kind else {}
        if parameter.default is inspect.Parameter.empty:
            required.append(name)
    description = (inspect.getdoc(function) or "").strip().split("\n\n")[0]
    return {"type": "function", "function": {"name": function.__name__, "description": description,
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}


def load_tools(specs: list[str]) -> dict[str, Tool]:
    """The tools `specs` name ('package.module:function' each), by name; ValueError naming `tools`."""
    tools: dict[str, Tool] = {}
    for spec in specs:
        function = import_callable(spec, "tools")
        schema = tool_schema(function)
        name = schema["function"]["name"]
        if name in tools:
            raise ValueError(f"tools: two tools are named {name!r} ({spec!r} and an earlier one); a call names one")
        tools[name] = Tool(name, function, schema)
    return tools


def _call(function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    result = function(**arguments)
    if inspect.isawaitable(result):
        async def waited() -> Any:
            return await result

        result = asyncio.run(waited())
    return result


class ToolRunner:
    """Runs calls against `tools`, each with `timeout` seconds; the calls given together run at once, each on a daemon
    thread of its own (a call that never returns cannot keep the process from exiting)."""

    def __init__(self, tools: dict[str, Tool], timeout: float):
        self.tools, self.timeout = tools, timeout

    def malformed(self, why: str) -> ToolResult:
        return ToolResult("", f"error: {why}", "malformed_call", 0.0)

    def start(self, call: ToolCall) -> tuple[threading.Thread | None, dict[str, Any]]:
        """Start `call` on a daemon thread; (the thread, or None for an unknown tool; the slot its outcome lands in)."""
        slot: dict[str, Any] = {}
        if call.name not in self.tools:
            return None, slot
        thread = threading.Thread(target=_run_into, args=(self.tools[call.name].function, call.arguments, slot),
                                  name=f"distill-tool-{call.name}", daemon=True)
        thread.start()
        return thread, slot

    def result_of(self, call: ToolCall, thread: threading.Thread | None, slot: dict[str, Any], seconds: float) -> ToolResult:
        """The outcome of a started call (`start`), as the conversation shows it, `seconds` after it started."""
        if thread is None:
            names = ", ".join(sorted(self.tools)) or "none"
            return ToolResult(call.name, f"error: there is no tool {call.name!r}; the tools are: {names}",
                              "unknown_tool", 0.0)
        if "value" not in slot and "error" not in slot:
            return ToolResult(call.name, f"error: {call.name} took longer than {self.timeout:g} s", "timeout", seconds)
        seconds = slot["seconds"]
        error = slot.get("error")
        if isinstance(error, TypeError):  # arguments that do not fit the signature (or a TypeError inside the tool)
            return ToolResult(call.name, f"error: {call.name} cannot take these arguments ({error})", "bad_arguments",
                              seconds)
        if error is not None:
            return ToolResult(call.name, f"error: {call.name} raised {type(error).__name__}: {error}", "raised", seconds)
        value = slot["value"]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return ToolResult(call.name, f"error: {call.name} returned {type(value).__name__}, not text", "not_text",
                              seconds)
        return ToolResult(call.name, str(value), None, seconds)


def _run_into(function: Callable[..., Any], arguments: dict[str, Any], slot: dict[str, Any]) -> None:
    started = time.perf_counter()
    try:
        value = _call(function, arguments)
    except Exception as error:
        slot.update(error=error, seconds=time.perf_counter() - started)
    else:
        slot.update(value=value, seconds=time.perf_counter() - started)


def run_calls(calls: list[tuple[ToolRunner, ToolCall]]) -> list[ToolResult]:
    """Each (runner, call)'s result, in order: every call starts at once, each given its runner's timeout from then."""
    started = time.perf_counter()
    running = [(runner, call, *runner.start(call)) for runner, call in calls]
    results = []
    for runner, call, thread, slot in running:
        if thread is not None:
            thread.join(max(runner.timeout - (time.perf_counter() - started), 0.0))
        results.append(runner.result_of(call, thread, slot, time.perf_counter() - started))
    return results
