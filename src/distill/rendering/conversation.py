"""A conversation rendered for training: each assistant turn in the context the template showed when it was generated.

Training on a conversation trains every assistant turn, its end-of-turn token included; system, user and tool turns
and what the template inserts between turns (the turn headers, the newline after `<|im_end|>`) stay attended but
are not trained.

Turn k of a conversation was generated after its context: the template's rendering of every message before it, with
the generation prompt (`context_k`); the turn itself is what rendering it as the last message adds after its
generation prompt (`turn_k`; a turn the template does not render as a continuation of its own generation prompt is
refused, naming the difference). A template *preserves prefixes* when `context_k + turn_k` is a prefix of `context_{k+1}` at every
assistant turn: the conversation is then one sequence, the first context as its prompt, then each turn's ids and
the template's ids between turns (tool results, later user turns, the next header), each piece tokenized on its own,
as a model generating turn by turn saw them (history is never re-tokenized). Only assistant-turn boundaries are
checked: Qwen2.5's and Qwen3's templates render consecutive `tool` messages as one user turn, which is not a prefix
of itself after each tool message, but is after the last.

A template that does not (Qwen3's drops the `<think>` block of assistant turns before the last user turn, and an
empty one from every turn but the last) is rendered in *pieces*: a new piece starts at each turn whose context does
not extend the text so far, its prompt that turn's context as the template renders it, tokenized whole. Turns whose
contexts do extend each other share a piece (a shared prefix). Every assistant turn is trained in exactly one piece,
in the context it was generated in; a piece re-reads its history, which is the cost (each piece is a sequence of its
own for the student and the teacher). A prefix-preserving conversation is one piece.

A template without tool support gets the calls in the Hermes format (`distill.conversations.tool_calls`); one with
it renders `tool_calls` and `tools` itself (probed with sentinels, as the reference library does). Template
arguments (`enable_thinking`, ...) are given to every rendering (`template_kwargs`).

The text renderer (`distill.rendering.text.TextRenderer`) renders multi-turn rows and rows with tools through this.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from distill.conversations.layout import Layout, LayoutBuilder
from distill.conversations.tool_calls import (
    CALL_FORMATS,
    CallFormat,
    ToolCall,
    tool_calls_of,
    tools_system_text,
    with_calls_in_text,
)

_SENTINELS = ("tool_name_5be1c0", "tool_key_9d2a71", "tool_value_3f08e4", "tool_result_c77b52")
_REASONING_SENTINEL = "reasoning_4e9a1d"


@dataclass(frozen=True)
class RenderedPiece:
    """One sequence of a conversation: prompt_ids: the context its first turn was generated in (the conversation up to
    it, with the generation prompt); completion_ids: that turn and the rest of the piece; trained: one flag per
    completion token (assistant tokens up to their end of turn); turns: its assistant turns; layout: the completion's
    model and environment segments, with the messages each environment segment renders and the conversation's
    messages before the piece (`Layout.history`, empty for the first)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    trained: tuple[bool, ...]
    turns: int
    layout: Layout


@dataclass(frozen=True)
class RenderedConversation:
    """A conversation as one or more pieces (module docstring): one for a template that preserves its prefixes."""

    pieces: tuple[RenderedPiece, ...]

    @property
    def assistant_turns(self) -> int:
        return sum(piece.turns for piece in self.pieces)


def renders_tool_calls(tokenizer, template_kwargs: Mapping[str, Any] | None = None) -> bool:
    """Whether the tokenizer's chat template renders an assistant's `tool_calls` and a `tool` message (all four
    sentinels of a probe conversation appear in its text)."""
    name, key, value, result = _SENTINELS
    probe = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"type": "function", "function": {"name": name, "arguments": {key: value}}}]},
             {"role": "tool", "name": name, "content": result}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False, **dict(template_kwargs or {}))
    except Exception:  # a template that refuses the roles (jinja's TemplateError, or a TypeError on dict arguments)
        return False
    return all(sentinel in text for sentinel in _SENTINELS)


def renders_reasoning(tokenizer, template_kwargs: Mapping[str, Any] | None = None) -> bool:
    """Whether the tokenizer's chat template shows an assistant message's `reasoning_content` (Qwen3's renders it as
    a `<think>` block) in a conversation's last turn."""
    probe = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "ok", "reasoning_content": _REASONING_SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False, **dict(template_kwargs or {}))
    except Exception:  # a template that refuses the probe shows nothing of it
        return False
    return _REASONING_SENTINEL in text


def first_difference(before: str, after: str) -> str:
    """Where `after` stops continuing `before`, in words: the character, what `before` had there and what `after` has
    (and which `<think>` block went missing, when one did)."""
    at = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    start = at  # shown from the start of the differing word or tag: '<think>' against '<tool_call>', not 'hink>'
    while start > 0 and at - start < 20 and not before[start - 1].isspace() and before[start - 1] != ">":
        start -= 1
    at = start
    had, has = before[at:], after[at:]
    why = ""
    if had.startswith("<think>") and not has.startswith("<think>"):
        why = " (a `<think>` block of an earlier turn is no longer shown)"
    return f"from character {at} it had {had[:60]!r}, now {has[:60]!r}{why}"


class ConversationRenderer:
    """Renders conversations for one tokenizer; `eos_ids`: the end-of-turn ids that close a trained assistant turn;
    `template_kwargs`: the template's own arguments (`enable_thinking`, ...), given to every rendering."""

    def __init__(self, tokenizer, eos_ids: list[int], template_kwargs: Mapping[str, Any] | None = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template, so conversations cannot be rendered")
        self.tokenizer, self.eos_ids = tokenizer, set(eos_ids)
        self.template_kwargs = dict(template_kwargs or {})
        self.template_renders_tools = renders_tool_calls(tokenizer, self.template_kwargs)
        self._renders_reasoning: bool | None = None
        self._call_format: tuple[CallFormat | None, str] | None = None

    def template_messages(self, messages: list[dict[str, Any]], tools: list[dict] | None,
                          where: str) -> tuple[list[dict[str, Any]], dict]:
        """The messages and keyword arguments the template is given: as they are for a template with tool support;
        otherwise with the calls written into the assistants' text and the tools into the system message. A message's
        `reasoning_content` reaches the template either way; a row that has one, for a template that never shows it,
        is refused (its reasoning would be dropped without a word)."""
        reasoning = next((i for i, m in enumerate(messages) if m.get("reasoning_content")), None)
        if reasoning is not None and not self.renders_reasoning():
            raise ValueError(f"{where} message {reasoning}: has 'reasoning_content', which this chat template does not "
                             "show, so it would not be trained; write the reasoning into the turn's content (e.g. as "
                             "<think>...</think> before the answer), or use a template that renders reasoning_content "
                             "(Qwen3's)")
        if self.template_renders_tools:
            return messages, ({"tools": tools} if tools else {})
        out = []
        for i, message in enumerate(messages):
            calls = tool_calls_of(message, f"{where} message {i}")
            plain = {"role": message["role"], "content": with_calls_in_text(message.get("content") or "", calls)}
            if message.get("reasoning_content"):
                plain["reasoning_content"] = message["reasoning_content"]
            out.append(plain)
        if tools:
            if out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{tools_system_text(tools)}"}
            else:
                out.insert(0, {"role": "system", "content": tools_system_text(tools)})
        return out, {}

    def call_format(self) -> tuple[CallFormat | None, str]:
        """(the format the template writes a tool call in, or None for one distill cannot read back; the probe
        call's turn as the template wrote it). Probed once: a turn holding one call is rendered, and the first of
        `CALL_FORMATS` whose parser reads that very call back from the turn's text is the template's."""
        if self._call_format is None:
            self._call_format = self._probe_call_format()
        return self._call_format

    def _probe_call_format(self) -> tuple[CallFormat | None, str]:
        name, key, value, _ = _SENTINELS
        tools = [{"type": "function", "function": {"name": name, "description": "a probe",
                                                   "parameters": {"type": "object", "properties": {key: {"type": "string"}}}}}]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "", "tool_calls": [
                                              {"type": "function", "function": {"name": name, "arguments": {key: value}}}]}]
        shown, extra = self.template_messages(messages, tools, "the call-format probe")
        opened = self.text(shown[:-1], extra, generation_prompt=True)
        turn = self.text(shown, extra, generation_prompt=False)
        turn = turn[len(os.path.commonprefix([opened, turn])):]  # after the generation prompt, or what they share
        ends = [at for at in (turn.find(self.tokenizer.decode([i])) for i in self.eos_ids) if at >= 0]
        turn = turn[: min(ends)] if ends else turn
        for candidate in CALL_FORMATS:
            if candidate.parse(turn).calls == [ToolCall(name, {key: value})]:
                return candidate, turn
        return None, turn

    def renders_reasoning(self) -> bool:
        if self._renders_reasoning is None:
            self._renders_reasoning = renders_reasoning(self.tokenizer, self.template_kwargs)
        return self._renders_reasoning

    def text(self, messages: list[dict[str, Any]], extra: dict, generation_prompt: bool) -> str:
        """The template's text of `messages` (`extra`: `template_messages`'s keyword arguments), with the template
        arguments: the one place a conversation meets the template."""
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **self.template_kwargs, **extra)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, where: str,
               per_turn: bool = False) -> RenderedConversation:
        """`messages`: a whole conversation holding at least one assistant turn after at least one other turn;
        `per_turn`: a piece for every assistant turn even where the template preserves prefixes (what a template
        that does not would give; tests compare the two)."""
        shown, extra = self.template_messages(messages, tools, where)
        inserted = len(shown) - len(messages)  # a system message showing the tools, for a template without tool support
        turns = [i for i, m in enumerate(shown) if m["role"] == "assistant"]
        contexts = [self.text(shown[:i], extra, generation_prompt=True) for i in turns]
        pieces: list[RenderedPiece] = []
        piece: _Piece | None = None
        for k, (i, context) in enumerate(zip(turns, contexts)):
            if piece is not None and not per_turn and context.startswith(piece.text):
                previous = turns[k - 1] - inserted
                piece.environment(context, tuple(dict(m) for m in messages[previous + 1 : i - inserted]))
            else:
                if piece is not None:
                    pieces.append(piece.done())
                history = tuple(dict(m) for m in messages[turns[0] - inserted : i - inserted])
                piece = _Piece(self, context, history)
            piece.turn(self._turn(shown, i, context, extra, f"{where} message {i - inserted}"))
        assert piece is not None, "a conversation holds an assistant turn"
        pieces.append(piece.done())
        return RenderedConversation(tuple(pieces))

    def _turn(self, shown: list[dict[str, Any]], i: int, context: str, extra: dict, where: str) -> str:
        """The text assistant turn `shown[i]` adds after its `context` (the turns before it with the generation
        prompt): what rendering it as the last message adds. Where that rendering also re-renders an earlier turn
        (Qwen3's drops the empty `<think>` block of a turn once another assistant turn follows it), the turn is what
        follows its generation prompt there. A turn that does not follow its generation prompt at all is refused."""
        end = self.text(shown[: i + 1], extra, generation_prompt=False)
        if end.startswith(context):
            return end[len(context):]
        before = self.text(shown[:i], extra, generation_prompt=False)
        if context.startswith(before) and len(context) > len(before):
            opening = context[len(before):]
            common = len(os.path.commonprefix([before, end]))
            at = end.find(opening, max(common - len(opening) + 1, 0))
            if at >= 0:
                return end[at + len(opening):]
        raise ValueError(f"{where}: the chat template renders this assistant turn as no continuation of its own "
                         f"generation prompt ({first_difference(context, end)}), so no model could have generated it "
                         "after that prompt (reasoning_content with enable_thinking false does this); make the turn "
                         "match the template's arguments (chat_template_kwargs)")


class _Piece:
    """A piece as it grows: its prompt's ids, then each turn's ids and the template's between them."""

    def __init__(self, renderer: ConversationRenderer, context: str, history: tuple[dict[str, Any], ...]):
        self.renderer, self.text, self.history = renderer, context, history
        self.prompt_ids = renderer.ids(context)
        self.ids: list[int] = []
        self.trained: list[bool] = []
        self.turns = 0
        self.layout = LayoutBuilder()

    def environment(self, context: str, messages: tuple[dict[str, Any], ...]) -> None:
        """What the template adds between the last turn and the next one's context (`messages`' turns, the header)."""
        segment = self.renderer.ids(context[len(self.text):])
        self.ids.extend(segment)
        self.trained.extend([False] * len(segment))
        self.layout.add(len(segment), False, messages)
        self.text = context

    def turn(self, text: str) -> None:
        """An assistant turn (`text`: what it adds after the piece so far), trained through its end of turn; what the
        template adds after that (ChatML's newline) is not."""
        segment = self.renderer.ids(text)
        stop = next((k + 1 for k, token in enumerate(segment) if token in self.renderer.eos_ids), len(segment))
        self.ids.extend(segment)
        self.trained.extend(k < stop for k in range(len(segment)))
        self.layout.add(stop, True)
        self.layout.add(len(segment) - stop, False)
        self.turns += 1
        self.text += text

    def done(self) -> RenderedPiece:
        return RenderedPiece(self.prompt_ids, self.ids, tuple(self.trained), self.turns,
                             self.layout.layout(history=self.history))
