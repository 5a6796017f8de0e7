"""The text renderer: rows of a text model, plain prompts and chat messages, one answer or a whole conversation.

Prompts go through the tokenizer's chat template (with the generation prompt) when they are messages; text
prompts are tokenized as they are. Prompts longer than `max_prompt_length` keep their end, where the question and
the assistant header are. A dataset completion is its text followed by EOS (what ChatML-style templates render for
an assistant turn), ending at its first EOS, cut to `max_new_tokens`. Multi-turn rows and rows with tools are
rendered turn by turn (`distill.rendering.conversation`), their trained mask and layout with them.
"""

from __future__ import annotations

import copy

from distill.conversations.layout import with_observation
from distill.data import EncodedExample, Example, RowPrompt
from distill.images import ImageRef
from distill.models.inputs import RowExtras
from distill.rendering.base import Renderer
from distill.rendering.conversation import ConversationRenderer
from distill.rendering.environment import EnvironmentTurns


class TextRenderer(Renderer):
    """Renders and tokenizes prompts and completions for one tokenizer (module docstring)."""

    def __init__(self, tokenizer, max_prompt_length: int, max_new_tokens: int, eos_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.max_new_tokens = max_new_tokens
        self.eos_token_ids = list(eos_token_ids)
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
               observation: str | None = None) -> RowPrompt:
        """`example`'s prompt, or `prompt`, another prompt for its row (a self-teacher's, with privileged context), in
        this renderer's ids, shown with the row's tools; `images`: the images it shows (a text model takes none)."""
        if images:
            raise ValueError(f"row {example.index}: its self-teacher prompt shows {len(images)} image(s), and this model "
                             "reads text only; use a vision-language model or give the privileged context as text")
        shown = with_observation(example.prompt if prompt is None else prompt, observation)
        return RowPrompt(*self.prompt_ids(shown, self.tools_of(example)))

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
        environment = EnvironmentTurns(self.tokenizer, self.conversations(), self.eos_token_ids)
        environment.check()
        return environment

    # ------------------------------------------------------------------------------------ its parts --
    def conversations(self) -> ConversationRenderer:
        """The renderer of multi-turn rows and rows with tools (made once: it probes the template)."""
        if self._conversations is None:
            self._check_template()
            self._conversations = ConversationRenderer(self.tokenizer, self.eos_token_ids)
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
        messages, extra = self.conversations().template_messages(prompt, tools, "prompt") if tools else (prompt, {})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)

    def prompt_ids(self, prompt: str | list[dict[str, str]], tools: list[dict] | None = None) -> tuple[list[int], bool]:
        """(token ids, whether the prompt was truncated)."""
        text = self.render(prompt, tools)
        # Chat templates already hold the special tokens (BOS etc.); plain text gets the tokenizer's own.
        ids = self.tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
        if len(ids) > self.max_prompt_length:
            return ids[-self.max_prompt_length :], True
        return ids, False

    def conversation(self, example: Example) -> EncodedExample:
        """A conversation row (`Example.turns`), encoded: the prompt keeps its end; the completion (every turn after
        the prompt) is cut to `max_new_tokens`, its trained mask with it."""
        assert isinstance(example.prompt, list) and example.turns is not None
        rendered = self.conversations().render(list(example.prompt) + list(example.turns), self.tools_of(example),
                                               f"row {example.index}")
        ids, truncated = rendered.prompt_ids, len(rendered.prompt_ids) > self.max_prompt_length
        if truncated:
            ids = ids[-self.max_prompt_length :]
        budget = self.max_new_tokens
        return EncodedExample(ids, truncated, rendered.completion_ids[:budget], self.extras(example),
                              rendered.trained[:budget], len(rendered.completion_ids) > budget,
                              rendered.layout.cut(budget))
