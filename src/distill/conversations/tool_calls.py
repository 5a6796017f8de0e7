"""Tool calls in a conversation: the format datasets hold them in, and the one distill writes where a chat template
has none.

Datasets hold calls as transformers' chat templates take them (the reference library's format too): an assistant
message with `tool_calls: [{"type": "function", "function": {"name": ..., "arguments": {...}}}]` (the arguments a
mapping, or its JSON text), answered by `tool` messages whose `content` is the result as text. A chat template with
tool support renders them itself. For one without (the default model's plain ChatML renders only `role` and
`content`), distill writes them in the Hermes format, the one most open tool-calling models were trained on, into
the assistant's text:

    <tool_call>
    {"name": "lookup", "arguments": {"key": "x"}}
    </tool_call>

and the tools' JSON schemas into the system message (`tools_system_text`); `parse_tool_calls` reads a generated turn
back. One module renders and parses, so what the student is trained to write is what the rollout parses.

A template with tool support writes calls its own way, and a sampled turn is read back in the same format
(`CallFormat`; the renderer finds which by rendering a probe call, `distill.rendering.conversation.call_format`):
Qwen2.5's and Qwen3's write the Hermes blocks above; Llama 3.1's, 3.2's and 3.3's write the whole turn as one JSON
object, one call per turn:

    {"name": "lookup", "parameters": {"key": "x"}}
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(CALL_OPEN) + r"(.*?)" + re.escape(CALL_CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    """One call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def tool_calls_of(message: dict[str, Any], where: str) -> list[ToolCall]:
    """The calls an assistant message holds (`tool_calls`, transformers' format), checked; [] when it holds none.
    Raises ValueError naming `where` for a malformed entry."""
    entries = message.get("tool_calls")
    if entries is None:
        return []
    if message.get("role") != "assistant":
        raise ValueError(f"{where}: a {message.get('role')!r} message holds 'tool_calls'; only assistant turns call tools")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: 'tool_calls' must be a non-empty list of calls, got {entries!r}")
    calls = []
    for entry in entries:
        function = entry.get("function", entry) if isinstance(entry, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(function, dict) or not isinstance(name, str) or not name:
            raise ValueError(f"{where}: a tool call needs {{'function': {{'name': ..., 'arguments': {{...}}}}}}, got {entry!r}")
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: tool call {name!r} has arguments that are not JSON ({error})") from None
        if not isinstance(arguments, dict):
            raise ValueError(f"{where}: tool call {name!r} needs arguments that are a JSON object, got {arguments!r}")
        calls.append(ToolCall(name, arguments))
    return calls


def render_tool_calls(calls: list[ToolCall]) -> str:
    """The calls in the Hermes format, one block each, separated by newlines."""
    return "\n".join(f"{CALL_OPEN}\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n"
                     f"{CALL_CLOSE}" for c in calls)


def with_calls_in_text(content: str, calls: list[ToolCall]) -> str:
    """An assistant turn's text with its calls written after it (a template without tool support)."""
    if not calls:
        return content
    return f"{content}\n{render_tool_calls(calls)}" if content.strip() else render_tool_calls(calls)


@dataclass(frozen=True)
class ParsedTurn:
    """A generated assistant turn read back: its text before the first call, the calls, and the blocks that did
    not parse (each a message saying why: the conversation answers them as errors)."""

    content: str
    calls: list[ToolCall]
    malformed: list[str]


def parse_tool_calls(text: str) -> ParsedTurn:
    """The Hermes-format calls in a generated turn; a block that is not a JSON object with a string `name` (and an
    object `arguments`, default {}) is reported in `malformed`, not raised."""
    calls, malformed = [], []
    for block in _CALL.findall(text):
        try:
            value = json.loads(block)
        except json.JSONDecodeError as error:
            malformed.append(f"the tool call is not JSON ({error.msg})")
            continue
        name = value.get("name") if isinstance(value, dict) else None
        arguments = value.get("arguments", {}) if isinstance(value, dict) else None
        if not isinstance(name, str) or not name or not isinstance(arguments, dict):
            malformed.append('a tool call is a JSON object {"name": "...", "arguments": {...}}')
            continue
        calls.append(ToolCall(name, arguments))
    head = text.split(CALL_OPEN, 1)[0].rstrip()
    return ParsedTurn(head, calls, malformed)


def parse_json_call(text: str) -> ParsedTurn:
    """A turn in Llama 3's call format: the whole turn one JSON object `{"name": ..., "parameters": {...}}`
    ("arguments" is read too); a turn that does not start with "{" is an answer. An object that does not parse, or
    lacks a string `name` or object parameters, is reported in `malformed`."""
    stripped = text.strip()
    if not stripped.startswith("{"):
        return ParsedTurn(text.rstrip(), [], [])
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError as error:
        return ParsedTurn("", [], [f"the tool call is not JSON ({error.msg})"])
    name = value.get("name") if isinstance(value, dict) else None
    arguments = value.get("parameters", value.get("arguments", {})) if isinstance(value, dict) else None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return ParsedTurn("", [], ['a tool call is a JSON object {"name": "...", "parameters": {...}}'])
    return ParsedTurn("", [ToolCall(name, arguments)], [])


@dataclass(frozen=True)
class CallFormat:
    """How a model writes tool calls in a turn (as its chat template renders them) and how distill reads them back:
    `parse` takes the turn's text without its end of turn; `several`: more than one call in a turn."""

    name: str
    example: str
    parse: Callable[[str], ParsedTurn]
    several: bool


HERMES = CallFormat("Hermes", '<tool_call>{"name": ..., "arguments": {...}}</tool_call>', parse_tool_calls, True)
JSON_OBJECT = CallFormat("JSON object", '{"name": ..., "parameters": {...}} as the whole turn', parse_json_call, False)
CALL_FORMATS = (HERMES, JSON_OBJECT)


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """What a template without tool support is told in the system message: the tools' schemas and how to call one."""
    schemas = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return (f"# Tools\nYou may call these tools:\n<tools>\n{schemas}\n</tools>\nTo call one, write:\n"
            f'{CALL_OPEN}\n{{"name": <name>, "arguments": <object>}}\n{CALL_CLOSE}')


def check_tools(tools: Any, where: str) -> list[dict[str, Any]]:
    """A row's `tools`: JSON schemas ({"type": "function", "function": {"name": ...}} or {"name": ...}), as a list or
    its JSON text; raises ValueError naming `where`."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: 'tools' is text that is not JSON ({error.msg}); give a list of JSON schemas") from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise ValueError(f"{where}: 'tools' must be a list of JSON schemas (objects), got {type(tools).__name__}")
    for tool in tools:
        function = tool.get("function", tool)
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"{where}: each tool schema needs a name ({{'type': 'function', 'function': {{'name': ...}}}}), "
                             f"got {tool!r}")
    return tools


def tool_names(tools: list[dict[str, Any]]) -> set[str]:
    return {tool.get("function", tool)["name"] for tool in tools}
