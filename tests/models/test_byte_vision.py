"""`byte-qwen2-vl[:LAYERSxHIDDEN]`: a Qwen2-VL built from scratch with its processor, seeded, saved and loaded back as
a run saves its model."""

from __future__ import annotations

import pytest
import torch
from PIL import Image, ImageDraw

from distill.models.byte_vision import IMAGE_SIDE, byte_vision_processor, parse_vision_shape
from distill.models.kinds import model_kind_of
from distill.models.loading import resolve_model_source
from distill.models.vision import processor_of, save_processor
from distill.teachers.build import load_model


def picture(colour: str) -> Image.Image:
    image = Image.new("RGB", (64, 64), "white")
    ImageDraw.Draw(image).ellipse((12, 12, 52, 52), fill=colour)
    return image


def test_shapes_and_their_errors():
    assert parse_vision_shape("byte-qwen2-vl") == (2, 64) and parse_vision_shape("byte-qwen2-vl:4x32") == (4, 32)
    for bad in ("byte-qwen2-vl:4x30", "byte-qwen2-vl:0x64", "byte-qwen2-vl:4"):
        with pytest.raises(ValueError, match="student: .*LAYERSxHIDDEN"):
            resolve_model_source(bad, "student")


def test_the_model_is_seeded_and_leaves_the_global_generator_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    first, _ = load_model("byte-qwen2-vl:2x32", "student")
    assert torch.equal(torch.rand(3), expected)
    second, _ = load_model("byte-qwen2-vl:2x32", "student")
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert first.config.get_text_config().num_hidden_layers == 2 and first.config.get_text_config().hidden_size == 32


def _answer_logits(model, tokenizer, image) -> torch.Tensor:
    processor = processor_of(model)
    text = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what color?"}]}],
                                         tokenize=False, add_generation_prompt=True)
    inputs = processor([text], [image])
    ids = inputs.pop("input_ids")
    mm = (ids == model.config.image_token_id).long()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids), mm_token_type_ids=mm, **inputs).logits[0, -1]


def test_an_image_block_becomes_its_image_tokens_and_the_answer_depends_on_the_picture():
    model, tokenizer = load_model("byte-qwen2-vl:2x32", "student")
    assert model_kind_of(model).name == "vision_language"
    text = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                                         tokenize=False, add_generation_prompt=True)
    assert "<|vision_start|><|image_pad|><|vision_end|>hi" in text
    ids = processor_of(model)([text], [picture("red")])["input_ids"][0].tolist()
    assert ids.count(model.config.image_token_id) == (IMAGE_SIDE // 28) ** 2  # 14-pixel patches merged 2 x 2
    assert not torch.equal(_answer_logits(model, tokenizer, picture("red")), _answer_logits(model, tokenizer, picture("blue")))


def test_saved_as_a_run_saves_it_it_loads_back_the_same(tmp_path):
    model, tokenizer = load_model("byte-qwen2-vl:2x32", "student")
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    save_processor(model, tmp_path)
    again, tokenizer_again = load_model(str(tmp_path), "student")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    text = byte_vision_processor().tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what shape?"}]}], tokenize=False,
        add_generation_prompt=True)
    assert torch.equal(processor_of(again)([text], [picture("red")])["input_ids"],
                       processor_of(model)([text], [picture("red")])["input_ids"])
    assert torch.equal(_answer_logits(again, tokenizer_again, picture("red")), _answer_logits(model, tokenizer, picture("red")))
