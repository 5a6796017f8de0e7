"""The text renderer: rows of a text model, plain prompts and chat messages, one answer or a whole conversation.

Prompts go through the tokenizer's chat template (with the generation prompt) when they are messages; text
prompts are tokenized as they are. Prompts longer than `max_prompt_length` keep their end, where the question and
the assistant header are. A dataset completion is its text followed by EOS (what ChatML-style templates render for
an assistant turn), ending at its first EOS, cut to `max_new_tokens`. Multi-turn rows and rows with tools are
rendered turn by turn (`distill.rendering.conversation`), their trained mask and layout with them; a conversation
whose template re-renders its history comes in pieces (`EncodedExample.later`).

Template arguments (`template_kwargs`: `enable_thinking` and whatever else the template reads) are held here and
given to every rendering of this renderer: prompts, conversations, the environment's turns, other prompts of a row.
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from distill.conversations.layout import with_observation
from distill.data import EncodedExample, Example, RowPrompt
from distill.images import ImageRef
from distill.models.inputs import RowExtras
from distill.rendering.base import Renderer
from distill.rendering.conversation import ConversationRenderer, RenderedPiece
from distill.rendering.environment import EnvironmentTurns


class TextRenderer(Renderer):
    """Renders and tokenizes prompts and completions for one tokenizer (module docstring)."""

    def __init__(self, tokenizer, max_prompt_length: int, max_new_tokens: int, eos_token_ids: list[int],
                 template_kwargs: Mapping[str, Any] | None = None):
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = list(eos_token_ids)
        self.template_kwargs = dict(template_kwargs or {})
        self._conversations: ConversationRenderer | None = None
        self.offered_tools: list[dict] | None = None  # the run's tools' schemas, shown to rows without a `tools` column

    # ------------------------------------------------------------------------------- the interface --
    def row(self, example: Example) -> EncodedExample:
        """A row in this tokenizer's ids: its prompt and, when it brings one, its completion (a conversation's with
        its trained mask: every assistant turn trained, the rest attended only)."""
        if example.turns is not None:
            return self.conversation(example)
        ids, truncated = self.prompt_ids(example.prompt, self.tools_of(example))
        completion = self.completion_ids(example.completion) if example.completion is not None else None
        return EncodedExample(ids, truncated, completion, self.extras(example))

    def prompt(self, example: Example, prompt: str | list[dict] | None = None, *, images: tuple[ImageRef, ...] = (),
               observation: str | None = None, history: tuple[dict, ...] = ()) -> RowPrompt:
        """`example`'s prompt, or `prompt`, another prompt for its row (a self-teacher's, with privileged context), in
        this renderer's ids, shown with the row's tools; `images`: the images it shows (a text model takes none);
        `history`: a later piece's messages after the prompt (`Layout.history`), rendered after it."""
        if images:
            raise ValueError(f"row {example.index}: its self-teacher prompt shows {len(images)} image(s), and this model "
                             "reads text only; use a vision-language model or give the privileged context as text")
        shown = with_observation(example.prompt if prompt is None else prompt, observation)
        if not history:
            return RowPrompt(*self.prompt_ids(shown, self.tools_of(example)))
        # A later piece's context keeps as many more tokens than the prompt's budget as its history adds (the
        # student's later pieces are cut so: `conversation`).
        tools = self.tools_of(example)
        grown = len(self._ids(with_history(shown, history, example.index), tools)) - len(self._ids(shown, tools))
        return RowPrompt(*self.prompt_ids(with_history(shown, history, example.index), tools, max(grown, 0)))

    def extras(self, example: Example) -> RowExtras:
        """The row's model inputs beyond its token ids: none for a text model (a model kind's renderer adds them)."""
        return {}

    def completion_ids(self, completion: str) -> list[int]:
        """Token ids of a dataset completion, ending at its first EOS (an EOS string inside the text counts)."""
        ids = self.tokenizer(completion, add_special_tokens=False)["input_ids"] + [self.eos_token_ids[0]]
        first_eos = next(i for i, token in enumerate(ids) if token in self.eos_token_ids)
        return ids[: first_eos + 1][: self.max_new_tokens]

    def offering(self, tools: list[dict] | None) -> TextRenderer:
        """This renderer, showing `tools` (JSON schemas: the run's `tools`) in the prompt of every row without its own."""
        renderer = copy.copy(self)
        renderer.offered_tools = list(tools) if tools else None
        return renderer

    def tools_of(self, example: Example) -> list[dict] | None:
        return example.tools if example.tools is not None else self.offered_tools

    def environment_turns(self) -> EnvironmentTurns:
        """The template's environment turns, checked (before any rollout) to append to what was sampled."""
        return EnvironmentTurns(self.tokenizer, self.conversations(), self.eos_token_ids)

    # ------------------------------------------------------------------------------------ its parts --
    def conversations(self) -> ConversationRenderer:
        """The renderer of multi-turn rows and rows with tools (made once: it probes the template)."""
        if self._conversations is None:
            self._check_template()
            self._conversations = ConversationRenderer(self.tokenizer, self.eos_token_ids, self.template_kwargs)
        return self._conversations

    def _check_template(self) -> None:
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template, so chat-message prompts cannot be rendered; give text prompts")

    def render(self, prompt: str | list[dict[str, str]], tools: list[dict] | None = None) -> str:
        """The prompt's text: as it is, or chat messages through the template with the generation prompt (and the
        row's tools, as the template or distill's tool-call format shows them)."""
        if isinstance(prompt, str):
            return prompt
        self._check_template()
        calls = any(m.get("tool_calls") or m.get("role") == "tool" for m in prompt)  # a later piece's history has them
        messages, extra = (self.conversations().template_messages(prompt, tools, "prompt") if tools or calls
                           else (prompt, {}))
        return self.conversations().text(messages, extra, generation_prompt=True)

    def prompt_ids(self, prompt: str | list[dict[str, str]], tools: list[dict] | None = None,
                   extra_room: int = 0) -> tuple[list[int], bool]:
        """(token ids, whether the prompt was truncated to `max_prompt_length` + `extra_room`, keeping its end)."""
        ids = self._ids(prompt, tools)
        limit = self.max_prompt_length + extra_room
        if len(ids) > limit:
            return ids[-limit:], True
        return ids, False

    def _ids(self, prompt: str | list[dict[str, str]], tools: list[dict] | None) -> list[int]:
        # Chat templates already hold the special tokens (BOS etc.); plain text gets the tokenizer's own.
        return self.tokenizer(self.render(prompt, tools), add_special_tokens=isinstance(prompt, str))["input_ids"]

    def conversation(self, example: Example) -> EncodedExample:
        """A conversation row (`Example.turns`), encoded: its first piece, and its later ones (`later`) where its
        template re-renders its history. Budgets: the first prompt keeps its end (`max_prompt_length`), a later piece's
        keeps as many more tokens as the conversation had grown by; `max_new_tokens` counts the conversation's tokens
        after its first prompt, so a piece starting past it is dropped and the one it falls in is cut, its trained
        mask with it."""
        assert isinstance(example.prompt, list) and example.turns is not None
        rendered = self.conversations().render(list(example.prompt) + list(example.turns), self.tools_of(example),
                                               f"row {example.index}")
        first = len(rendered.pieces[0].prompt_ids)
        pieces = [self._piece(piece, len(piece.prompt_ids) - first, example) for piece in rendered.pieces]
        kept = [piece for piece in pieces if piece is not None]
        if len(kept) < len(pieces):
            kept[-1].completion_cut = True
        head, *later = kept
        head.later = tuple(later)
        return head

    def _piece(self, piece: RenderedPiece, grown: int, example: Example) -> EncodedExample | None:
        """One piece within the budgets (`conversation`), None when it starts past `max_new_tokens`; `grown`: how many
        tokens longer its prompt is than the conversation's first."""
        room = self.max_new_tokens - max(grown, 0)
        if room <= 0:
            return None
        ids, limit = piece.prompt_ids, self.max_prompt_length + max(grown, 0)
        truncated = len(ids) > limit
        if truncated:
            ids = ids[-limit:]
        return EncodedExample(ids, truncated, piece.completion_ids[:room], self.extras(example), piece.trained[:room],
                              len(piece.completion_ids) > room, piece.layout.cut(room))


def with_history(prompt: str | list[dict[str, Any]], history: tuple[dict, ...], row: int) -> str | list[dict[str, Any]]:
    """`prompt` followed by a later piece's `history` (its messages after the row's prompt)."""
    if not history:
        return prompt
    if isinstance(prompt, str):
        raise ValueError(f"row {row}: a later piece of a conversation needs a prompt of chat messages, got text")
    return [*prompt, *history]
