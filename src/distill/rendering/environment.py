"""The environment's turns in a model's ids: what a chat template adds after an assistant's end of turn for tool
results (or user turns), through the next assistant turn's header.

The tool-call loop (`distill.agents.loop`) appends these ids to the ids the model sampled, and a
cross-tokenizer teacher renders the environment's turns between the student's turns with them. They come from
rendering a stand-in conversation with and without the tool turns: the text the template adds after an assistant's
end of turn does not depend on what the turn said, in a template that preserves prefixes (checked at every render).
"""

from __future__ import annotations

from typing import Any

from distill.conversations.tools import ToolResult
from distill.rendering.conversation import ConversationRenderer


class EnvironmentTurns:
    """The ids a template adds after an assistant's end of turn for some tool results, through the next header."""

    def __init__(self, tokenizer, renderer: ConversationRenderer, eos_ids: list[int]):
        self.tokenizer, self.renderer = tokenizer, renderer
        self.end_of_turn = tokenizer.decode([eos_ids[0]])

    def ids(self, results: list[ToolResult]) -> list[int]:
        """The ids of `results`' tool turns after an assistant's end of turn, through the next turn's header."""
        return self.after_turn([result.message() for result in results])

    def after_turn(self, messages: list[dict[str, Any]]) -> list[int]:
        """The ids the template adds after an assistant's end of turn for `messages` (tool results, user turns),
        through the next assistant turn's header. The stand-in assistant turn calls the tools the messages answer."""
        calls = [{"type": "function", "function": {"name": m.get("name") or "tool", "arguments": {}}}
                 for m in messages if m["role"] == "tool"]
        base: list[dict[str, Any]] = [{"role": "user", "content": "question"},
                                      {"role": "assistant", "content": "", **({"tool_calls": calls} if calls else {})}]
        shown, extra = self.renderer.template_messages(base + list(messages), None, "the tool turns")
        tokenizer = self.tokenizer
        before = tokenizer.apply_chat_template(shown[: len(shown) - len(messages)], tokenize=False, **extra)
        after = tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True, **extra)
        if not after.startswith(before):
            raise ValueError("the chat template renders an assistant turn differently once tool turns follow it, so the "
                             "tool results cannot be appended to the sampled ids (a template that preserves prefixes is "
                             "needed; see docs/usage.md, conversations)")
        end = before.rfind(self.end_of_turn)
        cut = end + len(self.end_of_turn) if end >= 0 else len(before)
        return tokenizer(after[cut:], add_special_tokens=False)["input_ids"]

    def retokenized(self, ids: list[int]) -> list[int]:
        """`ids` decoded to text and tokenized again (special tokens kept): what a trainer that re-tokenizes trains."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def check(self) -> None:
        """At start: a tool turn can be appended to an assistant turn (the template preserves prefixes)."""
        self.ids([ToolResult("probe", "probe result", None, 0.0)])
