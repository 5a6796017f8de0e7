"""The tools a rollout may call: Python callables named by import path, and what a failed call tells the model.

A tool is a function of keyword arguments returning text (a number is written as text). Its JSON schema, shown to
the model, comes from its signature and docstring (transformers' `get_json_schema` where the docstring has an
`Args:` section, otherwise the parameter names and annotations). An `async def` tool runs in its own event loop.
Calls run in worker processes (`distill.conversations.workers`), which import each tool by its path.

Nothing a tool does stops the run: a call to a tool that does not exist, one whose arguments do not fit, one that
raises, runs past `tool_timeout` (its worker is killed), exits, crashes, runs out of memory, or returns something
that is not text or is too long becomes an error message the model reads as the tool's result (`failure_message`),
counted by kind (`FAILURES`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from distill.callables import import_callable

# Each kind's message after "error: NAME ", with its detail (`worker_process.Reply.text`) in place of {}.
_SAYS = {
    "bad_arguments": "cannot take these arguments ({})",
    "raised": "raised {}",
    "timeout": "took longer than {} s and was stopped",
    "not_text": "returned {}, not text",
    "exited": "exited before returning a result ({})",
    "crashed": "crashed before returning a result ({})",
    "out_of_memory": "ran out of memory ({})",
    "too_long": "returned {}, too long to be a result",
}
FAILURES = ("unknown_tool", "malformed_call", *_SAYS)
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


@dataclass(frozen=True)
class Tool:
    """A tool: its name, the function (imported here for its schema), the schema, and its import path (what a worker
    imports it by)."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    spec: str


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
        tools[name] = Tool(name, function, schema, spec)
    return tools


def failure_message(name: str, kind: str, detail: str | None) -> str:
    """What the model reads when a call to `name` failed as `kind` (not unknown_tool or malformed_call, which say
    more), `detail` from the worker's reply."""
    return f"error: {name} " + _SAYS[kind].format(detail)


def failed(name: str, kind: str, detail: str | None, seconds: float) -> ToolResult:
    return ToolResult(name, failure_message(name, kind, detail), kind, seconds)


def unknown(name: str, known: list[str]) -> ToolResult:
    """A call to a tool there is none of; `known`: the names there are."""
    return ToolResult(name, f"error: there is no tool {name!r}; the tools are: {', '.join(sorted(known)) or 'none'}",
                      "unknown_tool", 0.0)


def malformed(why: str) -> ToolResult:
    """A call the model wrote that could not be read (`tool_calls.parse_tool_calls`' `malformed`)."""
    return ToolResult("", f"error: {why}", "malformed_call", 0.0)
