"""The environment's turns in a model's ids: what a chat template adds after an assistant's end of turn for tool
results (or user turns), through the next assistant turn's header; and, for a template that re-renders its history,
each turn's context as the template renders the conversation so far.

The tool-call loop (`distill.agents.loop`) asks a row's `TurnContexts` what follows each sampled turn:
- with a template that preserves prefixes (`EnvironmentTurns.preserves_prefixes`, probed with a stand-in
  conversation: an assistant turn with one call and with two, then their results), the ids the template adds after
  the turn's end-of-turn token, appended to the ids the model sampled (token-in, token-out; nothing already in the
  trajectory is re-tokenized). They come from rendering a stand-in conversation with and without the tool turns:
  in such a template the text after an assistant's end of turn does not depend on what the turn said.
- with one that does not (Qwen3's drops the empty `<think>` block of a turn once tool results follow it), the next
  context is the conversation re-rendered, as a server applying the template to the messages shows it: the sampled
  turn read back as a message (its text before the first call as content, its calls as `tool_calls`), then the
  results. Where that context still starts with every id so far, the new ids are appended as the environment's;
  where it does not, the trajectory starts a new piece with that context as its prompt (`distill.rendering.conversation`
  says what a piece is), so each turn is trained in the context it was generated in.

A cross-tokenizer teacher renders the environment's turns between the student's turns with `after_turn` (its template
must preserve prefixes: it renders each environment segment on its own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from distill.conversations.tool_calls import CALL_FORMATS, CallFormat, ParsedTurn
from distill.conversations.tools import ToolResult
from distill.rendering.conversation import ConversationRenderer, first_difference


class EnvironmentTurns:
    """The ids a template adds after an assistant's end of turn for some tool results, through the next header."""

    def __init__(self, tokenizer, renderer: ConversationRenderer, eos_ids: list[int]):
        self.tokenizer, self.renderer = tokenizer, renderer
        self.end_of_turn = tokenizer.decode([eos_ids[0]])
        self._problem: str | None | bool = False  # not probed yet

    def ids(self, results: list[ToolResult]) -> list[int]:
        """The ids of `results`' tool turns after an assistant's end of turn, through the next turn's header."""
        return self.after_turn([result.message() for result in results])

    def after_turn(self, messages: list[dict[str, Any]]) -> list[int]:
        """The ids the template adds after an assistant's end of turn for `messages` (tool results, user turns),
        through the next assistant turn's header. The stand-in assistant turn calls the tools the messages answer.
        Raises ValueError where the template renders the stand-in turn differently once the messages follow it."""
        calls = [{"type": "function", "function": {"name": m.get("name") or "tool", "arguments": {}}}
                 for m in messages if m["role"] == "tool"]
        base: list[dict[str, Any]] = [{"role": "user", "content": "question"},
                                      {"role": "assistant", "content": "", **({"tool_calls": calls} if calls else {})}]
        shown, extra = self.renderer.template_messages(base + list(messages), None, "the tool turns")
        before = self.renderer.text(shown[: len(shown) - len(messages)], extra, generation_prompt=False)
        after = self.renderer.text(shown, extra, generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template renders an assistant turn differently once tool turns follow it "
                             f"({first_difference(before, after)}), so the tool results cannot be appended to the "
                             "sampled ids; a template that preserves prefixes is needed here (docs/usage.md, conversations)")
        end = before.rfind(self.end_of_turn)
        cut = end + len(self.end_of_turn) if end >= 0 else len(before)
        return self.renderer.ids(after[cut:])

    @property
    def call_format(self) -> CallFormat:
        """How a sampled turn's calls are read: the format the template writes them in (`ConversationRenderer.
        call_format`). Raises ValueError for a template whose calls distill cannot read back."""
        found, written = self.renderer.call_format()
        if found is None:
            readable = "; ".join(f"{f.name}: {f.example}" for f in CALL_FORMATS)
            raise ValueError(f"the chat template writes a tool call as {written!r}, which distill cannot read back from "
                             f"a sampled turn, so the tool-call loop would see no call; it reads {readable}. Use a "
                             "chat template that writes calls in one of these formats")
        return found

    @property
    def problem(self) -> str | None:
        """Why the template cannot append tool turns to a sampled turn (it re-renders the turn once they follow), or
        None: probed once, with one result and, where a turn may hold several calls, with two (parallel calls)."""
        if self._problem is False:
            self._problem = None
            found, _ = self.renderer.call_format()
            for count in (1, 2) if found is None or found.several else (1,):
                try:
                    self.ids([ToolResult("probe", f"probe result {k}", None, 0.0) for k in range(count)])
                except ValueError as error:
                    self._problem = str(error)
                    break
        assert self._problem is not True
        return self._problem

    @property
    def preserves_prefixes(self) -> bool:
        return self.problem is None

    def check(self) -> None:
        """Raise `problem` (a renderer that appends environment turns on their own: a cross-tokenizer teacher's)."""
        if self.problem is not None:
            raise ValueError(self.problem)

    def context_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[int]:
        """The ids of the conversation `messages` with the generation prompt: the context of its next turn."""
        shown, extra = self.renderer.template_messages(messages, tools, "the conversation")
        return self.renderer.ids(self.renderer.text(shown, extra, generation_prompt=True))

    def retokenized(self, ids: list[int]) -> list[int]:
        """`ids` decoded to text and tokenized again (special tokens kept): what a trainer that re-tokenizes trains."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def contexts(self, prompt: list[int], messages: list[dict[str, Any]] | None, tools: list[dict] | None,
                 max_prompt_length: int) -> TurnContexts:
        """A row's turn contexts (module docstring): appended environment ids where the template preserves prefixes,
        else the conversation re-rendered from `messages` (the row's prompt as chat messages, observation included)."""
        if self.preserves_prefixes:
            return TurnContexts(self, prompt)
        if messages is None:
            raise ValueError(f"{self.problem}; a text prompt cannot be re-rendered as a conversation, give chat messages")
        return RerenderedContexts(self, prompt, list(messages), tools, max_prompt_length)


@dataclass(frozen=True)
class Next:
    """What follows a turn: `environment` ids appended to the trajectory (untrained), or a new piece's `prompt`
    (then `history`: the conversation's messages after the row's prompt, before the piece); `length`: the
    conversation's tokens after the row's prompt once the next turn's context is there (what the budget counts)."""

    environment: list[int] | None
    prompt: list[int] | None
    history: tuple[dict[str, Any], ...]
    length: int


class TurnContexts:
    """A row's turns in a template that preserves prefixes: what follows a turn is the template's tool turns,
    appended to the sampled ids (`EnvironmentTurns.ids`)."""

    def __init__(self, environment: EnvironmentTurns, prompt: list[int]):
        self.environment, self.prompt = environment, prompt

    def after(self, length: int, turn: list[int], parsed: ParsedTurn, results: list[ToolResult]) -> Next:
        """What follows a sampled `turn` (its `parsed` calls answered by `results`); `length`: the conversation's tokens
        after the row's prompt, the turn included."""
        ids = self.environment.ids(results)
        return Next(ids, None, (), length + len(ids))


class RerenderedContexts(TurnContexts):
    """A row's turns in a template that re-renders its history (module docstring): each turn's context is the
    conversation re-rendered. `prompt`: the row's prompt ids as the run encoded them (cut to `max_prompt_length`);
    a later context keeps as many more tokens as the conversation has grown by."""

    def __init__(self, environment: EnvironmentTurns, prompt: list[int], messages: list[dict[str, Any]],
                 tools: list[dict] | None, max_prompt_length: int):
        super().__init__(environment, prompt)
        self.messages, self.tools, self.max_prompt_length = messages, tools, max_prompt_length
        self.first = len(environment.context_ids(messages, tools))  # the row's prompt, uncut
        self.asked = len(messages)
        self.current = list(prompt)  # the piece's prompt and its ids so far

    def after(self, length: int, turn: list[int], parsed: ParsedTurn, results: list[ToolResult]) -> Next:
        self.current = self.current + list(turn)
        calls = [{"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                 for call in parsed.calls]
        self.messages += [{"role": "assistant", "content": parsed.content, **({"tool_calls": calls} if calls else {})},
                          *(result.message() for result in results)]
        context = self.environment.context_ids(self.messages, self.tools)
        grown = max(len(context) - self.first, 0)
        limit = self.max_prompt_length + grown
        context = context[-limit:]
        if context[: len(self.current)] == self.current:
            environment = context[len(self.current):]
            self.current = context
            return Next(environment, None, (), grown)
        self.current = context
        return Next(None, context, tuple(dict(m) for m in self.messages[self.asked:]), grown)
