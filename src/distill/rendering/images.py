"""The image renderer: rows with images in a vision-language model's ids and inputs (the `vision_language` model
kind's renderer; the processors themselves are `distill.models.vision`'s).

A vision-language model reads token ids in which each image is a run of placeholder tokens, plus the images'
pixel values (and, per family, grids or sizes). Its processor does both: the chat template renders an image block
as the family's placeholder, and the processor expands it to as many tokens as the image's size gives and turns
the image into pixel values.

How a row with images becomes inputs:
- at start (`row`): the prompt's token ids, placeholders expanded, from the processor run on blank images of
  each image's size as shown (`ImageRef.check`, known from the rows' checks): the ids depend on the size only, so
  no pixels are kept and a prompt whose image tokens overflow `max_prompt_length` fails naming its row before any
  model loads;
- when a micro-batch needs them (`DeferredExtras`): the images decoded and run through the processor again,
  giving the pixel values (and grids), every input in the "flat" layout (the images of every row, in row order);
  the ids must come out the same as at start. An image that no longer decodes, or gives other ids, was changed
  during the run: `ImageChangedError`, a step failure naming the row (the run checkpoints; restore the image and
  resume).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from distill.conversations.layout import with_observation
from distill.data import EncodedExample, Example, RowPrompt
from distill.errors import ImageChangedError
from distill.images import ImageRef, is_block_list
from distill.models.inputs import DeferredExtras, Extra, RowExtras
from distill.models.vision import PER_TOKEN, image_inputs
from distill.rendering.text import TextRenderer


class ImageRenderer(TextRenderer):
    """Rows with images in a vision-language model's ids and inputs (module docstring); rows without images as
    a `TextRenderer` does, with empty image inputs (so that rows with and without images share a batch)."""

    def __init__(self, tokenizer, processor, max_prompt_length: int, max_new_tokens: int, eos_token_ids: list[int],
                 template_kwargs: Mapping[str, Any] | None = None):
        super().__init__(tokenizer, max_prompt_length, max_new_tokens, eos_token_ids, template_kwargs)
        self.processor = processor
        # What a row without images carries: each input with no image in it, of the right trailing shape and dtype.
        self.empty = image_inputs(processor, [])

    def _process(self, text: str, images: list) -> dict[str, torch.Tensor]:
        """The processor's non-token outputs for `images`, and the prompt's ids (placeholders expanded) as "input_ids"."""
        out = self.processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
        return {name: value for name, value in out.items() if name not in PER_TOKEN or name == "input_ids"}

    def render(self, prompt, tools=None) -> str:
        if isinstance(prompt, list) and any(is_block_list(m.get("content")) for m in prompt):
            if tools:
                raise ValueError("a prompt with images and tools is not supported yet")
            template = getattr(self.processor, "chat_template", None)
            if template:
                return self.processor.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                                          **self.template_kwargs)
            self._check_template()
            return self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                                      **self.template_kwargs)
        return super().render(prompt, tools)

    def row(self, example: Example) -> EncodedExample:
        if not example.images:
            return super().row(example)
        from PIL import Image

        text = self.render(example.prompt, self.tools_of(example))
        sizes = [image.check() for image in example.images]
        ids = self._process(text, [Image.new("RGB", size) for size in sizes])["input_ids"][0].tolist()
        if len(ids) > self.max_prompt_length:
            raise ValueError(f"row {example.index}: its prompt with its {len(sizes)} image(s) is {len(ids)} tokens, more "
                             f"than its budget of {self.max_prompt_length} (max_prompt_length; a self-teacher's prompt: "
                             "max_teacher_prompt_length or max_reprompt_length); a prompt with images is never cut (its "
                             "image tokens would be). Raise the budget, or give smaller images (the processor's max_pixels)")
        completion = self.completion_ids(example.completion) if example.completion is not None else None
        return EncodedExample(ids, False, completion, self._deferred(example.index, text, example.images, ids))

    def prompt(self, example: Example, prompt: str | list[dict] | None = None, *, images: tuple[ImageRef, ...] = (),
               observation: str | None = None, history: tuple[dict, ...] = ()) -> RowPrompt:
        """A prompt of the row (a self-teacher's) showing `images`: its placeholders expanded for them (never cut).
        Its image inputs are the row's own (`extras`) when it shows the row's images, else its own. The row's own
        prompt (`prompt` None) shows the row's images, whatever `images` says. (A conversation's later piece,
        `history`, shows no images: a row with images is not a conversation.)"""
        if prompt is None:
            images = example.images
        if not images:
            return super().prompt(example, prompt, observation=observation, history=history)
        shown = with_observation(example.prompt if prompt is None else prompt, observation)
        encoded = self.row(Example(example.index, shown, None, images=images))
        same = len(images) == len(example.images) and all(a is b for a, b in zip(images, example.images))
        return RowPrompt(encoded.prompt_ids, False, None if same else encoded.extras)

    def extras(self, example: Example) -> RowExtras:
        return dict(self.empty) if not example.images else self.row(example).extras

    def _deferred(self, index: int, text: str, images: tuple[ImageRef, ...], ids: list[int]) -> DeferredExtras:
        def load() -> dict[str, Extra]:
            out = self._process(text, [image.load() for image in images])
            if out.pop("input_ids")[0].tolist() != ids:
                raise ImageChangedError(f"row {index}: its images give other image tokens than when the run started (an "
                                        "image file was replaced during the run); restore it")
            return {name: Extra(value, "flat") for name, value in out.items()}

        return DeferredExtras(tuple(self.empty), load)
