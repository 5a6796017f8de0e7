"""A dataset conversation's turns checked as the row is loaded (`distill.data`), naming the row and the message.

- Each trained assistant turn (the completion's) says something: text or tool calls. One with neither would be
  trained as "end your turn at once" (the end-of-turn token right after the header), which no dataset means.
- Tool calls are well formed (`tool_calls_of`) and call tools the row offers, when it lists them.
- Each `tool` message answers a call of the assistant turn before it: there are no more of them than it made calls,
  and where the row gives ids (the calls' `id` and the message's `tool_call_id`) the id is one of those calls' and is
  answered once. A row whose calls carry no ids is matched by position, as chat templates do.

Message indices count the prompt's messages first, then the completion's (a `messages` row: its own indices).
"""

from __future__ import annotations

from typing import Any

from distill.conversations.tool_calls import tool_calls_of, tool_names


def says_something(content: Any) -> bool:
    """Whether an assistant turn's `content` holds text (a string, or text blocks), not only whitespace."""
    if isinstance(content, str):
        return bool(content.strip())
    if isinstance(content, list):
        return any(isinstance(block, dict) and says_something(block.get("text")) for block in content)
    return False


def empty_turn_message(where: str) -> str:
    """The refusal of an assistant turn (at `where`) with neither text nor calls."""
    return (f"{where}: an assistant turn with neither text nor tool calls would be trained as 'end your turn at "
            "once'; give the turn its text or its 'tool_calls', or leave it out (a row that ends before its answer is "
            "a prompt, which the run answers itself)")


def _call_ids(message: dict[str, Any]) -> list[str]:
    """The ids the row gives an assistant turn's calls (transformers' `{"id": ..., "function": ...}`), in order."""
    entries = message.get("tool_calls") or []
    return [str(entry["id"]) for entry in entries if isinstance(entry, dict) and entry.get("id") is not None]


def check_turns(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, where: str, trained_from: int) -> None:
    """The turns of a conversation (its prompt's, then its completion's from index `trained_from` on, already well
    formed `{"role", "content"}` messages) checked as the module docstring says; ValueError naming `where` and the
    message index."""
    pending = 0  # calls of the last assistant turn not answered yet
    asked_at = 0  # that turn's index
    offered: list[str] = []  # its calls' ids
    answered: dict[str, int] = {}  # the ids answered -> by which message
    for i, message in enumerate(messages):
        at = f"{where} message {i}"
        calls = tool_calls_of(message, at)
        if tools is not None:
            unknown = sorted({c.name for c in calls} - tool_names(tools))
            if unknown:
                raise ValueError(f"{at}: calls {unknown}, which the row's 'tools' do not offer ({sorted(tool_names(tools))})")
        if message["role"] == "assistant" and i >= trained_from and not calls and not says_something(message.get("content")):
            raise ValueError(empty_turn_message(at))
        if message["role"] != "tool":
            pending = len(calls)
            asked_at, offered, answered = i, _call_ids(message), {}
            continue
        if pending == 0:
            raise ValueError(f"{at}: a 'tool' message answers no tool call (it comes before any call, or after every "
                             "call was answered)")
        pending -= 1
        answer = message.get("tool_call_id")
        if answer is None or not offered:
            continue
        if str(answer) not in offered:
            raise ValueError(f"{at}: its tool_call_id {answer!r} answers no call of the assistant turn before it "
                             f"(message {asked_at}, whose calls have the ids {offered}); give it the id of the call it "
                             "answers")
        if str(answer) in answered:
            raise ValueError(f"{at}: its tool_call_id {answer!r} answers a call that message {answered[str(answer)]} "
                             f"answered already (the calls of message {asked_at} have the ids {offered}); each call is "
                             "answered once")
        answered[str(answer)] = i
