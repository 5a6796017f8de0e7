"""A vision-language model built from scratch: `student: byte-qwen2-vl` (or `byte-qwen2-vl:LAYERSxHIDDEN`).

A Qwen2-VL (transformers' `Qwen2VLForConditionalGeneration`) with a small language model over the byte vocabulary
(`distill.models.byte_student`'s 256 bytes and ChatML markers, plus Qwen2-VL's image tokens: <|vision_start|>,
<|image_pad|>, <|vision_end|>, <|video_pad|>) and a small vision tower (2 blocks, width 64; 14-pixel patches merged
2 x 2), initialised with a fixed seed. Its processor is distill's `ImageTextProcessor` over transformers' PIL image
processor (no torchvision), which scales every image to `IMAGE_SIDE` x `IMAGE_SIDE` pixels: 16 image tokens.

It needs no download, which makes it the CPU recipes' vision-language model (`vision_teacher` trains one on the
bundled easy-VQA slice; `vision` distils that teacher into a smaller student). A run saves it like any model:
weights, tokenizer and image processor in the run's `model/`, loadable by transformers.
"""

from __future__ import annotations

import re

import torch

from distill.models.byte_student import byte_tokenizer

PREFIX = "byte-qwen2-vl"
DEFAULT_SHAPE = (2, 64)
IMAGE_SIDE = 112  # pixels: 8 x 8 patches of 14, merged 2 x 2 into 16 image tokens
INIT_STD = 0.2  # of the weights' random init: transformers' 0.02 leaves so small a model's image features too faint to learn from
IMAGE_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for block in m['content'] %}"
    "{% if block['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def is_byte_vision(spec: str) -> bool:
    return spec == PREFIX or spec.startswith(PREFIX + ":")


def parse_vision_shape(spec: str) -> tuple[int, int]:
    """(layers, hidden) of the language model of 'byte-qwen2-vl' or 'byte-qwen2-vl:2x64'; raises ValueError with the
    accepted form (hidden a multiple of 16: two attention heads whose rotary halves split into Qwen2-VL's three
    sections)."""
    if spec == PREFIX:
        return DEFAULT_SHAPE
    match = re.fullmatch(PREFIX + r":(\d+)x(\d+)", spec)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 16 or int(match.group(2)) % 16:
        raise ValueError(f"{spec!r} must be '{PREFIX}' or '{PREFIX}:LAYERSxHIDDEN' (hidden a multiple of 16), "
                         f"e.g. '{PREFIX}:2x64'")
    return int(match.group(1)), int(match.group(2))


def byte_vision_processor():
    """The processor: the byte tokenizer with Qwen2-VL's image tokens and a chat template that renders image blocks
    as Qwen2-VL's do, and the PIL image processor at `IMAGE_SIDE` x `IMAGE_SIDE` pixels."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from distill.models.vision import ImageTextProcessor

    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *IMAGE_TOKENS.values()]})
    tokenizer.chat_template = CHAT_TEMPLATE
    pixels = IMAGE_SIDE * IMAGE_SIDE
    images = Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels)
    return ImageTextProcessor(tokenizer, images, IMAGE_TOKENS["image_token_id"])


def _mrope_sections(head_dim: int) -> list[int]:
    """Qwen2-VL's rotary sections (time, height, width), summing to half the head size."""
    half = head_dim // 2
    time_ = half // 4
    height = (half - time_) // 2
    return [time_, height, half - time_ - height]


def byte_qwen2_vl(spec: str, tokenizer) -> torch.nn.Module:
    """A randomly initialised Qwen2-VL over `tokenizer` (`byte_vision_processor`'s), seeded without touching the
    global RNG."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    layers, hidden = parse_vision_shape(spec)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in IMAGE_TOKENS.items()}
    special = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024,
                         rope_scaling={"type": "mrope", "mrope_section": _mrope_sections(hidden // 2)},
                         tie_word_embeddings=True, initializer_range=INIT_STD, **special),
        vision_config=dict(depth=2, embed_dim=64, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3, initializer_range=INIT_STD),
        tie_word_embeddings=True, **special, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen2VLForConditionalGeneration(config)
