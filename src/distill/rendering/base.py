"""The renderer interface: how a model turns a dataset row (or another prompt of the row) into its token ids.

Every model kind has a renderer (`distill.models.kinds.ModelKind.encoder` builds it); training, evaluation,
`distill cache-teacher`, the self-teacher's prompts, sdpo's reprompts and a cross-tokenizer teacher's own prompts
all call these entry points and nothing else, so a template quirk or a new modality is handled here once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from distill.data import EncodedExample, Example, RowPrompt
    from distill.images import ImageRef
    from distill.models.inputs import RowExtras
    from distill.rendering.environment import EnvironmentTurns


# What distill gives `apply_chat_template` itself (or what changes what it returns): not a template's own argument.
RESERVED_TEMPLATE_ARGUMENTS = ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                               "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                               "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")


def check_template_kwargs(name: str, kwargs: Mapping[str, Any] | None) -> None:
    """A run's template arguments (`name`: the config field): a mapping of a template's own arguments, none of them
    one distill passes itself (`RESERVED_TEMPLATE_ARGUMENTS`); raises ValueError naming the field and the key."""
    if kwargs is None:
        return
    for key in kwargs:
        if key in RESERVED_TEMPLATE_ARGUMENTS:
            what = ("the run's tools (`tools`, or the rows' `tools` column)" if key == "tools"
                    else "distill's own rendering")
            raise ValueError(f"{name}: {key!r} is set by {what}, not a template argument; remove it (template arguments "
                             "are what the chat template itself reads, e.g. enable_thinking)")


class Renderer(ABC):
    """One model's rendering of rows: its tokenizer (and processor), its budgets, its end-of-turn ids.

    `max_prompt_length`: prompt tokens kept (a longer prompt keeps its end); `max_new_tokens`: completion tokens
    kept; `eos_token_ids`: the ids that end a completion, the first appended to a dataset's answer;
    `offered_tools`: the run's tools' JSON schemas, shown to rows without a `tools` column; `template_kwargs`: the
    chat template's own arguments (`enable_thinking`, ...), given to every rendering this renderer makes, so no
    caller passes them (a run's `chat_template_kwargs` for the student, `teacher_chat_template_kwargs` for a
    teacher that renders its own prompts)."""

    tokenizer: Any  # a transformers tokenizer (a processor's, for a vision-language model)
    max_prompt_length: int
    max_new_tokens: int
    eos_token_ids: list[int]
    offered_tools: list[dict] | None
    template_kwargs: dict[str, Any]

    @abstractmethod
    def row(self, example: Example) -> EncodedExample:
        """A row in this model's ids: its prompt (end kept), its completion when it brings one (a conversation's
        with its trained mask and layout), its extra inputs (`extras`)."""

    @abstractmethod
    def prompt(self, example: Example, prompt: str | list[dict] | None = None, *, images: tuple[ImageRef, ...] = (),
               observation: str | None = None, history: tuple[dict, ...] = ()) -> RowPrompt:
        """A prompt of `example`'s row in this model's ids, shown with the row's tools: its own prompt, or `prompt`
        (a self-teacher's prompt with privileged context, an sdpo reprompt) showing `images`; `observation`: an
        environment's text after the prompt's last message, as the student saw it; `history`: the messages after
        the prompt that a later piece of a conversation was generated after (`Layout.history`)."""

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
        """The template's environment turns (what follows an assistant's end of turn, or the conversation re-rendered
        where the template re-renders its history)."""
