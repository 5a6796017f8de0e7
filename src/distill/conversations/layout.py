"""A conversation's completion as segments: the model's turns and the environment's, with what the environment said.

The student's completion ids of a conversation alternate between the model's turns (the sampled ids, or a dataset's
assistant turn, through its end-of-turn token) and what comes between them (the template's glue after the end of
turn, tool results, later user turns, the next turn's header). A `Layout` records that split and, for each
environment segment, the messages it renders, so a teacher with another tokenizer can render the same conversation
with its own template: the model's turns as the bytes the student wrote, the environment's turns as its template
renders those messages (`distill.teachers.cross_tokenizer`). Plain values only, so a checkpoint keeps it.

A conversation whose template re-renders its history (not prefix-preserving: `distill.rendering.conversation`) is
trained in pieces, each its own prompt; a later piece's layout names the conversation's messages between the row's
prompt and the piece (`history`: the model's turns as messages, the environment's), so another renderer (a
cross-tokenizer teacher, a self-teacher's prompt) can render the context that piece was generated in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple


@dataclass(frozen=True)
class Segment:
    """`length` completion tokens: the model's (`assistant`) or the environment's; `messages`: the turns an environment
    segment renders (tool results as `tool` messages, user turns), empty for template glue alone."""

    length: int
    assistant: bool
    messages: tuple[dict[str, Any], ...] = ()


class Span(NamedTuple):
    """A segment with its place in the completion: tokens `start` .. `end` - 1."""

    start: int
    end: int
    segment: Segment


@dataclass(frozen=True)
class Layout:
    """The segments of one completion, in order; `observation`: the text an environment's `reset` appended to the
    prompt's last user message (the student's prompt ids hold it; another tokenizer's rendering, and a self-teacher's
    prompt, need the text); `reward`: what the environment's `get_reward` said at the end of the conversation;
    `history`: for a later piece of a conversation (module docstring), the messages between the row's prompt and the
    piece's first turn, which its prompt renders; empty for the first piece (its prompt is the row's)."""

    segments: tuple[Segment, ...]
    observation: str | None = None
    reward: float | None = None
    history: tuple[dict[str, Any], ...] = ()

    @property
    def length(self) -> int:
        return sum(segment.length for segment in self.segments)

    def spans(self) -> list[Span]:
        """Each segment with its place in the completion, in order."""
        out, start = [], 0
        for segment in self.segments:
            out.append(Span(start, start + segment.length, segment))
            start += segment.length
        return out

    def cut(self, length: int) -> "Layout":
        """The layout of the completion's first `length` tokens (a budget cut)."""
        kept, room = [], length
        for segment in self.segments:
            if room <= 0:
                break
            kept.append(Segment(min(segment.length, room), segment.assistant, segment.messages))
            room -= segment.length
        return Layout(tuple(kept), self.observation, self.reward, self.history)

    def final_turn(self, ids: list[int]) -> list[int]:
        """The ids of the model's last turn (what a reward or an evaluation reads as the answer)."""
        turns = [(start, end) for start, end, segment in self.spans() if segment.assistant]
        return list(ids[turns[-1][0]:turns[-1][1]]) if turns else []

    def transcript(self, ids: list[int], decode: Callable[[list[int]], str]) -> str:
        """The conversation as readable text (an sdpo demonstration): the model's turns decoded, each tool result as a
        `<tool_response>` block (the Hermes format's), other turns as `role: content`."""
        parts = []
        for start, end, segment in self.spans():
            if segment.assistant:
                parts.append(decode(list(ids[start:end])).strip())
            for message in segment.messages:
                content = str(message.get("content") or "")
                parts.append(f"<tool_response>\n{content}\n</tool_response>" if message["role"] == "tool"
                             else f"{message['role']}: {content}")
        return "\n".join(part for part in parts if part)

    def to_plain(self) -> dict[str, Any]:
        plain: dict[str, Any] = {"segments": [[s.length, s.assistant, [dict(m) for m in s.messages]] for s in self.segments],
                                 "observation": self.observation, "reward": self.reward}
        if self.history:  # written only when there is one: a first piece's plain form is as it always was
            plain["history"] = [dict(m) for m in self.history]
        return plain

    @classmethod
    def from_plain(cls, plain: dict[str, Any]) -> "Layout":
        return cls(tuple(Segment(int(length), bool(assistant), tuple(dict(m) for m in messages))
                         for length, assistant, messages in plain["segments"]), plain.get("observation"),
                   plain.get("reward"), tuple(dict(m) for m in plain.get("history") or ()))


def with_observation(prompt: str | list[dict[str, Any]], observation: str | None) -> str | list[dict[str, Any]]:
    """`prompt` with an environment's observation appended to its text, or to its last message's content."""
    if observation is None:
        return prompt
    if isinstance(prompt, str):
        return prompt + observation
    return [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + observation}]


class LayoutBuilder:
    """Builds a layout as a completion grows: consecutive environment pieces join one segment."""

    def __init__(self) -> None:
        self.segments: list[Segment] = []

    def add(self, length: int, assistant: bool, messages: tuple[dict[str, Any], ...] = ()) -> None:
        if length == 0 and not messages:
            return
        last = self.segments[-1] if self.segments else None
        if last is not None and not assistant and not last.assistant:
            self.segments[-1] = Segment(last.length + length, False, last.messages + tuple(messages))
        else:
            self.segments.append(Segment(length, assistant, tuple(messages)))

    def layout(self, observation: str | None = None, reward: float | None = None,
               history: tuple[dict[str, Any], ...] = ()) -> Layout:
        return Layout(tuple(self.segments), observation, reward, history)
