"""A conversation rendered for training: the prompt's token ids, then the rest as token ids with a trained mask.

Training on a conversation trains every assistant turn, its end-of-turn token included; system, user and tool turns
and what the template inserts between turns (the turn headers, the newline after `<|im_end|>`) stay attended but
are not trained. The prompt is the conversation up to its first assistant turn, rendered with the generation
prompt, as a single-turn row's is.

The rest is rendered turn by turn as the difference the template adds: the text of turns 0..i minus the text of
turns 0..i-1, each difference tokenized on its own, so the ids are the ones a model generating turn by turn would
have seen (history is never re-tokenized). That needs a template that preserves prefixes: rendering more turns
must not change the text of the earlier ones. A template that does (Qwen3's strips `<think>` blocks from
assistant turns before the last user turn) is refused for that row, with what to do.

A template without tool support gets the calls in the Hermes format (`distill.conversations.tool_calls`); one with
it renders `tool_calls` and `tools` itself (probed with sentinels, as the reference library does).

The text renderer (`distill.rendering.text.TextRenderer`) renders multi-turn rows and rows with tools through this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distill.conversations.layout import Layout, LayoutBuilder
from distill.conversations.tool_calls import tool_calls_of, tools_system_text, with_calls_in_text

_SENTINELS = ("tool_name_5be1c0", "tool_key_9d2a71", "tool_value_3f08e4", "tool_result_c77b52")


@dataclass(frozen=True)
class RenderedConversation:
    """prompt_ids: the turns before the first assistant turn with the generation prompt; completion_ids: the rest;
    trained: one flag per completion token (assistant tokens up to their end of turn); assistant_turns: how many;
    layout: the completion's model and environment segments, with the messages each environment segment renders."""

    prompt_ids: list[int]
    completion_ids: list[int]
    trained: tuple[bool, ...]
    assistant_turns: int
    layout: Layout


def renders_tool_calls(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders an assistant's `tool_calls` and a `tool` message (all four
    sentinels of a probe conversation appear in its text)."""
    name, key, value, result = _SENTINELS
    probe = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": name, "arguments": {key: value}}}]},
             {"role": "tool", "name": name, "content": result}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False)
    except Exception:  # a template that refuses the roles (jinja's TemplateError, or a TypeError on dict arguments)
        return False
    return all(sentinel in text for sentinel in _SENTINELS)


class ConversationRenderer:
    """Renders conversations for one tokenizer; `eos_ids`: the end-of-turn ids that close a trained assistant turn."""

    def __init__(self, tokenizer, eos_ids: list[int]):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template, so conversations cannot be rendered")
        self.tokenizer, self.eos_ids = tokenizer, set(eos_ids)
        self.template_renders_tools = renders_tool_calls(tokenizer)

    def template_messages(self, messages: list[dict[str, Any]], tools: list[dict] | None,
                          where: str) -> tuple[list[dict[str, Any]], dict]:
        """The messages and keyword arguments the template is given: as they are for a template with tool support;
        otherwise with the calls written into the assistants' text and the tools into the system message."""
        if self.template_renders_tools:
            return messages, ({"tools": tools} if tools else {})
        out = []
        for i, message in enumerate(messages):
            calls = tool_calls_of(message, f"{where} message {i}")
            plain = {"role": message["role"], "content": with_calls_in_text(message.get("content") or "", calls)}
            out.append(plain)
        if tools:
            if out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_system_text(tools)}"}
            else:
                out.insert(0, {"role": "system", "content": tools_system_text(tools)})
        return out, {}

    def _text(self, messages: list[dict[str, Any]], extra: dict, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **extra)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, where: str) -> RenderedConversation:
        """`messages`: a whole conversation holding at least one assistant turn after at least one other turn."""
        shown, extra = self.template_messages(messages, tools, where)
        inserted = len(shown) - len(messages)  # a system message showing the tools, for a template without tool support
        first = next(i for i, m in enumerate(shown) if m["role"] == "assistant")
        rendered = self._text(shown[:first], extra, generation_prompt=True)
        prompt_ids = self._ids(rendered)
        ids: list[int] = []
        trained: list[bool] = []
        layout = LayoutBuilder()

        def extend(text: str, turn: int, assistant: bool) -> None:
            nonlocal rendered
            if not text.startswith(rendered):
                raise ValueError(self._drift_message(where, turn, rendered, text))
            segment = self._ids(text[len(rendered):])
            if assistant:  # trained through its end of turn; what the template adds after it is not
                end = next((k + 1 for k, token in enumerate(segment) if token in self.eos_ids), len(segment))
                flags = [k < end for k in range(len(segment))]
                layout.add(end, True)
                layout.add(len(segment) - end, False)
            else:
                flags = [False] * len(segment)
                own = shown[turn]["role"] != "assistant"  # a turn of its own, or the header before an assistant's
                layout.add(len(segment), False, (dict(messages[turn - inserted]),) if own else ())
            ids.extend(segment)
            trained.extend(flags)
            rendered = text

        for i in range(first, len(shown)):
            if shown[i]["role"] == "assistant":
                extend(self._text(shown[:i], extra, generation_prompt=True), i, assistant=False)  # its header, if not yet
                extend(self._text(shown[: i + 1], extra, generation_prompt=False), i, assistant=True)
            else:
                extend(self._text(shown[: i + 1], extra, generation_prompt=False), i, assistant=False)
        turns = sum(m["role"] == "assistant" for m in shown[first:])
        return RenderedConversation(prompt_ids, ids, tuple(trained), turns, layout.layout())

    @staticmethod
    def _drift_message(where: str, turn: int, before: str, after: str) -> str:
        common = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
        stripped = "<think>" in before[common:] and "<think>" not in after[common:]
        why = (" (it drops the `<think>` block of an earlier assistant turn, as Qwen3's template does once a later "
               "user turn follows)" if stripped else "")
        return (f"{where}: the chat template renders the conversation's earlier turns differently once message {turn} is "
                f"added{why}: from character {common} it had {before[common:common + 40]!r}, now "
                f"{after[common:common + 40]!r}. distill trains the tokens each turn was generated from, which needs a "
                "template that preserves prefixes: remove what the template drops from the earlier turns of this row "
                "(e.g. their <think> blocks), or save the tokenizer with a chat template that keeps them and use that "
                "directory")
