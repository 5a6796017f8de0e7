"""Rendering: a dataset row, or another prompt of the row, in a model's token ids; the only place a chat template
is applied.

One interface (`Renderer`), one renderer per model kind (`distill.models.kinds` says which): it renders a row
(prompt ids, completion ids, the per-token trained mask, extra inputs, the layout of model and environment
segments), a self-teacher's prompt with privileged context, an sdpo reprompt, another tokenizer's prompt (a
cross-tokenizer teacher has a renderer of its own), the environment's turns between sampled ones, and the
template probes the doctor reads.

- `base.py`: `Renderer`, the interface every caller uses.
- `text.py`: `TextRenderer`: plain prompts and chat messages; multi-turn rows and tools through
  `conversation.py`'s `ConversationRenderer` (a conversation as the prompt's ids and the rest's ids with a trained
  mask, rendered turn by turn as the template's differences; in pieces, each turn in the context it was generated
  in, where the template re-renders its history).
- `images.py`: `ImageRenderer`: rows with images through a vision-language model's processor.
- `environment.py`: `EnvironmentTurns`: the ids the template adds after an assistant's turn for tool results, or
  the conversation re-rendered where the template re-renders its history (the tool-call loop's turn contexts).
- `probes.py`: template probes (tool support, prefix preservation, the generation prompt).
- `base.py`: `Renderer`, and the check of a run's template arguments.

A renderer holds its model's template arguments (`template_kwargs`: the run's `chat_template_kwargs`, or a
teacher's `teacher_chat_template_kwargs`) and gives them to every rendering it makes.
"""

from distill.rendering.base import Renderer
from distill.rendering.conversation import ConversationRenderer, RenderedConversation, renders_tool_calls
from distill.rendering.environment import EnvironmentTurns
from distill.rendering.images import ImageRenderer
from distill.rendering.text import TextRenderer

__all__ = ["ConversationRenderer", "EnvironmentTurns", "ImageRenderer", "RenderedConversation", "Renderer",
           "TextRenderer", "renders_tool_calls"]
