"""Tiny vision-language models built here, offline: a Qwen2-VL (2-layer language model, 1-layer vision tower) with
a tokenizer trained on the bundled prompts, its image processor (PIL only: no torchvision) and a chat template
that renders image blocks as Qwen2-VL's do; and coloured-shape images drawn with PIL."""

from __future__ import annotations

import torch

from tests.conftest import BUNDLED

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                 "<|video_pad|>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for block in m['content'] %}"
    "{% if block['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
IMAGE_SIDE = 56  # 56 x 56 pixels: 16 patches of 14, merged 2 x 2 into 4 image tokens


def qwen_tokenizer(vocab_size: int = 300):
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line)["messages"][0]["content"] for line in BUNDLED.read_text().splitlines()]
    texts += ["What colour is the shape? Which shape is it? red green blue yellow square circle triangle",
              "user assistant system"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=QWEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = QWEN_TEMPLATE
    return fast


def qwen_processor(tokenizer=None):
    """The tiny Qwen2-VL's processor: transformers' `Qwen2VLProcessor` needs torchvision (its video processor), which
    this environment lacks, so distill's `ImageTextProcessor` (tokenizer + PIL image processor + Qwen-VL expansion)."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from distill.models.vision import ImageTextProcessor

    tokenizer = tokenizer or qwen_tokenizer()
    images = Qwen2VLImageProcessorPil(min_pixels=IMAGE_SIDE * IMAGE_SIDE, max_pixels=IMAGE_SIDE * IMAGE_SIDE)
    return ImageTextProcessor(tokenizer, images, "<|image_pad|>")


def _mrope_sections(head_dim: int) -> list[int]:
    """Qwen2-VL's rotary sections (time, height, width), summing to half the head size: [2, 3, 3] for a head of 16."""
    half = head_dim // 2
    time_ = half // 4
    height = (half - time_) // 2
    return [time_, height, half - time_ - height]


def tiny_qwen_vl(tokenizer, layers: int = 2, seed: int = 0, hidden: int = 32):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": _mrope_sections(hidden // 2)}, initializer_range=0.2,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=True),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=hidden, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3, initializer_range=0.2),
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
        tie_word_embeddings=True, **ids)
    torch.manual_seed(seed)
    return Qwen2VLForConditionalGeneration(config)


def shape_image(colour: str = "red", shape: str = "square", side: int = IMAGE_SIDE, background: str = "white",
                box: tuple[int, int, int, int] | None = None):
    """A `side` x `side` RGB image of one filled shape (square, circle or triangle) in `colour`, inside `box`
    (left, top, right, bottom; default: centred, three fifths of the side)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (side, side), background)
    draw = ImageDraw.Draw(image)
    box = box or (side // 5, side // 5, side - side // 5, side - side // 5)
    if shape == "square":
        draw.rectangle(box, fill=colour)
    elif shape == "circle":
        draw.ellipse(box, fill=colour)
    else:
        draw.polygon([(side // 2, box[1]), (box[2], box[3]), (box[0], box[3])], fill=colour)
    return image


def save_qwen_vl(directory, layers: int = 2, seed: int = 0):
    """A tiny Qwen2-VL saved with its processor in `directory` (what `distill` loads as a model spec)."""
    processor = qwen_processor()
    model = tiny_qwen_vl(processor.tokenizer, layers=layers, seed=seed)
    model.save_pretrained(directory)
    processor.tokenizer.save_pretrained(directory)
    processor.image_processor.save_pretrained(directory)
    return directory


LLAVA_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for block in m['content'] %}"
    "{% if block['type'] == 'image' %}<image>\n{% elif block['type'] == 'text' %}{{ block['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)


def llava_processor():
    """A second family: LLaVA's processor (no video processor, so transformers' own class loads without torchvision),
    another tokenizer (the tests' 340-token one plus `<image>`) and another image scheme: a CLIP vision tower on 28 x 28
    images (center-cropped), 4 patches, each image one `<image>` expanded to 4 tokens."""
    from transformers import CLIPImageProcessor, LlavaProcessor

    from tests.conftest import train_tiny_tokenizer

    tokenizer = train_tiny_tokenizer(340)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = LLAVA_TEMPLATE
    images = CLIPImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    return LlavaProcessor(image_processor=images, tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default",
                          image_token="<image>", num_additional_image_tokens=1, chat_template=LLAVA_TEMPLATE)


def tiny_llava(tokenizer, layers: int = 2, seed: int = 0, hidden: int = 32):
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, initializer_range=0.2),
        vision_config=dict(model_type="clip_vision_model", hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(config)


def save_llava(directory, layers: int = 2, seed: int = 0):
    processor = llava_processor()
    tiny_llava(processor.tokenizer, layers=layers, seed=seed).save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
