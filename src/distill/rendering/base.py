"""The renderer interface: how a model turns a dataset row (or another prompt of the row) into its token ids.

Every model kind has a renderer (`distill.models.kinds.ModelKind.encoder` builds it); training, evaluation,
`distill cache-teacher`, the self-teacher's prompts, sdpo's reprompts and a cross-tokenizer teacher's own prompts
all call these entry points and nothing else, so a template quirk or a new modality is handled here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distill.data import EncodedExample, Example, RowPrompt
    from distill.images import ImageRef
    from distill.models.inputs import RowExtras
    from distill.rendering.environment import EnvironmentTurns


class Renderer(ABC):
    """One model's rendering of rows: its tokenizer (and processor), its budgets, its end-of-turn ids.

    `max_prompt_length`: prompt tokens kept (a longer prompt keeps its end); `max_new_tokens`: completion tokens
    kept; `eos_token_ids`: the ids that end a completion, the first appended to a dataset's answer;
    `offered_tools`: the run's tools' JSON schemas, shown to rows without a `tools` column."""

    tokenizer: Any  # a transformers tokenizer (a processor's, for a vision-language model)
    max_prompt_length: int
    max_new_tokens: int
    eos_token_ids: list[int]
    offered_tools: list[dict] | None

    @abstractmethod
    def row(self, example: Example) -> EncodedExample:
        """A row in this model's ids: its prompt (end kept), its completion when it brings one (a conversation's
        with its trained mask and layout), its extra inputs (`extras`)."""

    @abstractmethod
    def prompt(self, example: Example, prompt: str | list[dict] | None = None, *, images: tuple[ImageRef, ...] = (),
               observation: str | None = None) -> RowPrompt:
        """A prompt of `example`'s row in this model's ids, shown with the row's tools: its own prompt, or `prompt`
        (a self-teacher's prompt with privileged context, an sdpo reprompt) showing `images`; `observation`: an
        environment's text after the prompt's last message, as the student saw it."""

    @abstractmethod
    def extras(self, example: Example) -> RowExtras:
        """The row's model inputs beyond its token ids (pixel values, image grids; none for a text model)."""

    @abstractmethod
    def completion_ids(self, completion: str) -> list[int]:
        """Token ids of a dataset completion, ending at its first end-of-turn id, cut to `max_new_tokens`."""

    @abstractmethod
    def offering(self, tools: list[dict] | None) -> Renderer:
        """This renderer, showing `tools` (JSON schemas: the run's) in the prompt of every row without its own."""

    @abstractmethod
    def tools_of(self, example: Example) -> list[dict] | None:
        """The tools `example`'s prompt shows: its own `tools` column, else the offered ones."""

    @abstractmethod
    def environment_turns(self) -> EnvironmentTurns:
        """The template's environment turns (what follows an assistant's end of turn), checked to preserve prefixes."""
