"""Model kinds: how a dataset row becomes a model's inputs, and how a model gives its hidden states.

A kind is a part (registered like methods and engines). It says which models it `applies` to, builds the
renderer (`distill.rendering.Renderer`) that turns a row into token ids plus named extra inputs
(`distill.models.inputs.Extra`: a vision-language model's pixel values and image grid sizes), and runs the model's
own forward to the last hidden states (B, T, H), with those extras, for the student, the teacher and the server
alike. Generation passes the same extras to the engine (`distill.generation.DecodeRequest.extras`).

The built-in kinds: `causal_lm` applies to every model not claimed by another kind: token ids only, hidden
states from the decoder (`get_decoder()`, which computes no logits); `vision_language`
(`distill.models.vision`) to image-text-to-text models, both declared by `distill.parts` (name and import path,
as every built-in part is). A kind registered later is asked first.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Mapping

import torch
from torch import nn

from distill.models.vision import image_token_ids, is_vision_language, placeholder_id, processor_of, unwrapped
from distill.registry import Registry, resolve

if TYPE_CHECKING:
    from distill.rendering import Renderer


class ModelKind(ABC):
    """A model kind (module docstring). Subclasses set `name` and implement `applies` and `hidden`."""

    name: str = ""
    fields: tuple[type, ...] = ()  # a kind has no settings of its own (every part declares them; the table reads it)

    @abstractmethod
    def applies(self, model: nn.Module) -> bool:
        """Whether `model` is of this kind."""

    def encoder(self, tokenizer, max_prompt_length: int, max_new_tokens: int, eos_ids: list[int],
                model: nn.Module | None = None, template_kwargs: Mapping[str, Any] | None = None) -> Renderer:
        """The renderer of this kind for `model` (its `extras(example)` gives a row's inputs beyond the ids);
        `template_kwargs`: the chat template's arguments, given to every rendering it makes."""
        from distill.rendering.text import TextRenderer  # rendering sits beside models and imports their leaves

        return TextRenderer(tokenizer, max_prompt_length, max_new_tokens, eos_ids, template_kwargs)

    def forward_inputs(self, model: nn.Module, input_ids: torch.Tensor,
                       extras: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The keyword inputs of `model`'s forward (and `generate`) beyond the ids and the attention mask, for this
        batch of ids (B, T) as padded: the collated row extras, plus what a kind derives from the ids."""
        return dict(extras)

    def never_generated(self, model: nn.Module) -> list[int]:
        """Token ids the model must never sample (a vision-language model's image placeholders)."""
        return []

    @abstractmethod
    def hidden(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               extras: dict[str, torch.Tensor]) -> torch.Tensor:
        """Last hidden states (B, T, H) of `model` on the batch, through its own forward, without logits."""


class CausalLM(ModelKind):
    name = "causal_lm"

    def applies(self, model: nn.Module) -> bool:
        return True

    def hidden(self, model, input_ids, attention_mask, extras):
        if extras:
            raise ValueError(f"a causal LM takes token ids only, this batch carries {sorted(extras)}: register the model "
                             "kind of this model (distill.models.kinds.register_model_kind)")
        decoder = model.get_decoder()
        return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


class VisionLanguage(ModelKind):
    name = "vision_language"

    def applies(self, model: nn.Module) -> bool:
        return is_vision_language(unwrapped(model))

    def encoder(self, tokenizer, max_prompt_length, max_new_tokens, eos_ids, model=None, template_kwargs=None) -> Renderer:
        from distill.rendering.images import ImageRenderer

        if model is None:
            raise ValueError("the vision_language kind builds its encoder from the model's processor; pass the model")
        return ImageRenderer(tokenizer, processor_of(model), max_prompt_length, max_new_tokens, eos_ids, template_kwargs)

    def forward_inputs(self, model, input_ids, extras):
        """The batch's image inputs, none when the batch shows no image (a vision tower run on no image fails in
        some families), and `mm_token_type_ids` (B, T: 1 at image placeholders) where the forward takes it."""
        placeholders = input_ids == placeholder_id(model)
        inputs = dict(extras) if bool(placeholders.any()) else {}
        backbone = self._backbone(model)
        if "mm_token_type_ids" in inspect.signature(backbone.forward).parameters:
            inputs["mm_token_type_ids"] = placeholders.to(torch.long)
        return inputs

    def never_generated(self, model):
        return image_token_ids(model)

    @staticmethod
    def _backbone(model: nn.Module) -> nn.Module:
        inner = unwrapped(model)
        return getattr(inner, inner.base_model_prefix)

    def hidden(self, model, input_ids, attention_mask, extras):
        inputs = self.forward_inputs(model, input_ids, extras)
        return self._backbone(model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                                     **inputs).last_hidden_state



def _check_kind(kind: ModelKind) -> None:
    if not kind.name:
        raise TypeError(f"register_model_kind: {type(kind).__name__} is not a named distill.models.kinds.ModelKind")


def _declare_built_ins() -> None:
    resolve("distill.parts:declare_model_kinds")(MODEL_KINDS)


# The table lives with the interface (it imports torch; a kind has no settings, so the config never needs it); the
# catalogue (`distill.parts`, by import path) declares the built-in kinds into it when it is first used.
MODEL_KINDS: Registry[ModelKind] = Registry("model kind", "model kind", load=_declare_built_ins,
                                            interface="distill.models.kinds:ModelKind", check=_check_kind)
FALLBACK = "causal_lm"  # the kind of every model no other kind claims, and of a model outside the process


def register_model_kind(kind: ModelKind | type[ModelKind]) -> ModelKind:
    """Add `kind` (an instance, or its class: an abstract member left out is refused, named); it is asked before
    the kinds registered earlier (and before `causal_lm`)."""
    return MODEL_KINDS.register(kind)


def unregister_model_kind(name: str) -> None:
    MODEL_KINDS.unregister(name)


def model_kind_of(model: nn.Module | None) -> ModelKind:
    """The first registered kind (latest first) that applies to `model`; `causal_lm` otherwise (and for None:
    a model outside the process, whose inputs are token ids)."""
    if model is None:
        return MODEL_KINDS.get(FALLBACK)
    asked = [name for name in reversed(MODEL_KINDS.names()) if name != FALLBACK]
    return next((kind for kind in map(MODEL_KINDS.get, asked) if kind.applies(model)), MODEL_KINDS.get(FALLBACK))
