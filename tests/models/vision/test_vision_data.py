"""Rows with images: content blocks and an `images` column (relative paths, bytes, PIL images in a datasets.Dataset),
decoded only when a micro-batch needs them; bad input fails early naming the row, and loses nothing."""

from __future__ import annotations

import io
import json

import datasets
import pytest

from distill.batch import Completion, collate
from distill.data import examples_from_dataset
from distill.errors import ImageChangedError
from distill.images import ImageRef
from distill.models.kinds import model_kind_of
from distill.models.vision import attach_processor
from distill.training.trainer import Distiller
from tests.helpers.training import forbid_model_loading
from tests.models.vision.models import qwen_processor, shape_image, tiny_qwen_vl
from tests.models.vision.test_vision_runs import _config, write_shapes

ASK = {"type": "text", "text": "What colour?"}


def _row(count: int, images) -> dict:
    return {"prompt": [{"role": "user", "content": [{"type": "image"}] * count + [ASK]}], "images": images, "completion": "red"}


def test_images_as_bytes_pil_images_and_relative_paths(tmp_path):
    png = io.BytesIO()
    shape_image("green").save(png, format="PNG")
    from_pil = examples_from_dataset(datasets.Dataset.from_list([_row(1, [shape_image("red")])]), "dataset")[0]
    from_bytes = examples_from_dataset(datasets.Dataset.from_list([_row(1, [png.getvalue()])]), "dataset")[0]
    assert from_pil.images[0].data is not None and from_bytes.images[0].data == png.getvalue()  # read undecoded
    assert from_pil.images[0].load().getpixel((28, 28)) == (255, 0, 0)
    assert from_bytes.images[0].load().getpixel((28, 28)) == (0, 128, 0)
    path = write_shapes(tmp_path)  # relative paths from the dataset file's folder
    rows = datasets.load_dataset("json", data_files=path, split="train")
    example = examples_from_dataset(rows, "dataset", tmp_path)[0]
    assert example.images[0].path == str(tmp_path / "images" / "0-0.png")
    # A block may name its own image; text-only blocks become text.
    own = {"prompt": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                      {"role": "user", "content": [{"type": "image", "image": "images/0-0.png"}, ASK]}]}
    example = examples_from_dataset(datasets.Dataset.from_list([own]), "dataset", tmp_path)[0]
    assert example.prompt[0]["content"] == "Be brief." and example.images[0].path.endswith("images/0-0.png")
    assert ImageRef(path=example.images[0].path).digest() == ImageRef(image=shape_image("red")).digest()


@pytest.mark.parametrize("row, message", [
    (_row(1, ["missing.png"]), r"dataset row 0 message 0, image 1 of the 'images' column: image .*missing.png does not exist"),
    (_row(1, ["notes.png"]), r"dataset row 0 message 0, image 1 of the 'images' column: image .*notes.png cannot be read as an image"),
    (_row(2, ["images/0-0.png"]), "show 2 or more images from the 'images' column, which holds 1"),
    (_row(0, ["images/0-0.png"]), "holds 1 images and its content blocks show 0"),
    ({"prompt": "What colour?", "images": ["images/0-0.png"]}, "has images but a text prompt"),
    ({"prompt": [{"role": "user", "content": [ASK]}], "completion": [{"role": "assistant", "content": [{"type": "image"}]}]},
     "the 'assistant' turn shows an image"),
    ({"prompt": [{"role": "user", "content": [{"type": "video"}]}]}, "a content block must be"),
    ({"prompt": [{"role": "user", "content": [{"type": "image", "image": "https://example.com/a.png"}]}]}, "is a URL"),
])
def test_bad_image_rows_fail_naming_the_row(tmp_path, row, message):
    write_shapes(tmp_path)
    (tmp_path / "notes.png").write_text("not an image")
    with pytest.raises(ValueError, match=message):
        examples_from_dataset(datasets.Dataset.from_list([row]), "dataset", tmp_path)
    assert (tmp_path / "notes.png").read_text() == "not an image"  # nothing of the user's touched


def test_a_missing_image_fails_before_any_model_loads(tmp_path, monkeypatch):
    path = write_shapes(tmp_path / "data")
    (tmp_path / "data" / "images" / "2-1.png").unlink()
    forbid_model_loading(monkeypatch)
    with pytest.raises(ValueError, match=r"dataset row 2 message 0, image 2 of the 'images' column: image .*2-1.png does not exist"):
        Distiller(_config(tmp_path, {"teacher": "t", "student": "s", "data": path}, student=None, teacher="smollm2-135m-instruct"))


def test_pixels_are_decoded_when_a_micro_batch_needs_them_and_long_image_prompts_are_refused(tmp_path, monkeypatch):
    processor = qwen_processor()
    model = tiny_qwen_vl(processor.tokenizer)
    attach_processor(model, processor)
    encoder = model_kind_of(model).encoder(processor.tokenizer, 64, 8, [processor.tokenizer.eos_token_id], model)
    examples = examples_from_dataset(datasets.Dataset.from_list([_row(2, [shape_image("red"), shape_image("blue")])]), "dataset")
    loads = []
    original = ImageRef.load
    monkeypatch.setattr(ImageRef, "load", lambda self: loads.append(self) or original(self))
    encoded = encoder.row(examples[0])
    assert loads == [] and encoded.prompt_ids.count(model.config.image_token_id) == 8
    batch = collate([Completion(encoded.prompt_ids, [5, 6], "dataset", extras=encoded.extras)], "dataset", 0)
    assert len(loads) == 2 and batch.extras["pixel_values"].shape == (32, 1176)
    tight = model_kind_of(model).encoder(processor.tokenizer, 12, 8, [processor.tokenizer.eos_token_id], model)
    with pytest.raises(ValueError, match=r"row 0: its prompt with its 2 image\(s\) is \d+ tokens, more than its budget of 12 \(max_prompt_length"):
        tight.row(examples[0])


def test_an_image_replaced_during_the_run_is_an_error(tmp_path):
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    from distill.models.vision import ImageTextProcessor

    path = write_shapes(tmp_path)
    tokenizer = qwen_processor().tokenizer  # an image processor whose token count follows the image's size
    processor = ImageTextProcessor(tokenizer, Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112), "<|image_pad|>")
    model = tiny_qwen_vl(tokenizer)
    attach_processor(model, processor)
    encoder = model_kind_of(model).encoder(tokenizer, 64, 8, [tokenizer.eos_token_id], model)
    rows = datasets.load_dataset("json", data_files=path, split="train")
    encoded = encoder.row(examples_from_dataset(rows, "dataset", tmp_path)[0])
    shape_image("red", side=112).save(tmp_path / "images" / "0-0.png")  # 4x the pixels: 4x the image tokens
    with pytest.raises(ImageChangedError, match=r"dataset row 0 message 0, image 1 of the 'images' column: image .*0-0.png "
                       r"decodes to 112x112 pixels, and to 56x56 when the run started"):
        collate([Completion(encoded.prompt_ids, [5], "dataset", extras=encoded.extras)], "dataset", 0)
    assert json.loads((tmp_path / "shapes.jsonl").read_text().splitlines()[0])["images"] == ["images/0-0.png"]
