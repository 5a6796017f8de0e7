"""Images of dataset rows decoded whole once when the rows are read: a damaged body under a valid header, a file cut
short, a wrong checksum or a refused mode fail naming the row and the image before any model loads; an image that
decoded at the start and no longer does (or decodes to another size) is a step failure naming the row."""

from __future__ import annotations

import io
import json

import datasets
import numpy as np
import pytest
from PIL import Image

from distill.data import examples_from_dataset
from distill.errors import ImageChangedError, StepFailure
from distill.images import ImageRef
from distill.training.trainer import Distiller
from tests.helpers.images import damaged_body
from tests.helpers.training import forbid_model_loading
from tests.models.vision.models import shape_image
from tests.models.vision.test_vision_runs import _config, write_shapes

WHERE = r"dataset row 2 message 0, image 2 of the 'images' column: image .*2-1.png"


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _damage(path, how: str) -> None:
    good = path.read_bytes()
    if how == "damaged body":  # every checksum holds; the compressed pixels are noise
        path.write_bytes(damaged_body(good))
    elif how == "cut short":
        path.write_bytes(good[: len(good) * 2 // 3])
    elif how == "wrong checksum":  # one byte of the pixel data flipped
        at = good.index(b"IDAT") + 20
        path.write_bytes(good[:at] + bytes([good[at] ^ 0xFF]) + good[at + 1:])
    else:  # a float image of 0..255, which would clip to white
        Image.fromarray(np.full((56, 56), 200.0, np.float32)).save(path, format="TIFF")


@pytest.mark.parametrize("how, message", [
    ("damaged body", "cannot be decoded .*broken data stream.*: its data is damaged or cut short; replace it with a good "
                     "copy, or drop the row"),
    ("cut short", "cannot be decoded .*: its data is damaged or cut short"),
    ("wrong checksum", "cannot be decoded .*checksum.*: its data is damaged"),
    ("float of 0..255", r"is refused: it is a float image \(mode 'F'\) with values from 200 to 200, .*; scale it into 0..1"),
])
def test_a_bad_image_under_a_valid_header_fails_naming_its_row_before_any_model_loads(tmp_path, monkeypatch, how, message):
    path = write_shapes(tmp_path / "data")
    image = tmp_path / "data" / "images" / "2-1.png"
    with Image.open(image) as opened:
        assert opened.size == (56, 56)  # the header of the good file
    _damage(image, how)
    kept = image.read_bytes()
    with Image.open(image) as opened:
        assert opened.size == (56, 56)  # still a valid header: only a full decode tells
    forbid_model_loading(monkeypatch)
    with pytest.raises(ValueError, match=f"{WHERE} {message}"):
        Distiller(_config(tmp_path, {"teacher": "t", "student": "s", "data": path}, student=None, teacher="smollm2-135m-instruct"))
    assert image.read_bytes() == kept  # the user's file untouched


def test_each_image_is_decoded_once_at_the_start_and_then_when_a_batch_needs_it(tmp_path, monkeypatch):
    path = write_shapes(tmp_path)
    decoded = []
    original = ImageRef._decode
    monkeypatch.setattr(ImageRef, "_decode", lambda self, **kw: decoded.append(self.path) or original(self, **kw))
    rows = datasets.load_dataset("json", data_files=path, split="train")
    examples = examples_from_dataset(rows, "dataset", tmp_path)
    shown = [image.path for example in examples for image in example.images]
    assert sorted(decoded) == sorted(shown) and len(shown) == 8
    assert [image.check() for image in examples[2].images] == [(56, 56), (56, 56)]  # remembered: not decoded again
    assert len(decoded) == 8
    assert np.array_equal(np.asarray(examples[0].images[0].load()), np.asarray(shape_image("red")))
    assert len(decoded) == 9


@pytest.mark.parametrize("how", ["damaged body", "cut short", "replaced by a larger image"])
def test_an_image_that_changed_after_the_start_is_a_step_failure_naming_its_row(tmp_path, how):
    path = write_shapes(tmp_path)
    rows = datasets.load_dataset("json", data_files=path, split="train")
    image = examples_from_dataset(rows, "dataset", tmp_path)[2].images[1]
    file = tmp_path / "images" / "2-1.png"
    if how == "replaced by a larger image":
        shape_image("blue", side=112).save(file)
        message = "decodes to 112x112 pixels, and to 56x56 when the run started .*; restore it"
    else:
        _damage(file, how)
        message = "cannot be decoded .*: its data is damaged or cut short; it decoded when the run started, so it changed during the run: restore it"
    with pytest.raises(ImageChangedError, match=f"{WHERE} {message}") as raised:
        image.load()
    assert isinstance(raised.value, StepFailure) and raised.value.resume_hint == "once the image is restored"


def test_an_image_never_checked_fails_as_bad_input_not_as_a_step():
    bad = ImageRef(data=damaged_body(_png(shape_image())), where="dataset row 4 message 0, image 1 of the 'images' column")
    with pytest.raises(ValueError, match="dataset row 4 message 0, image 1 of the 'images' column: an image given as bytes "
                                         "cannot be decoded"):
        bad.load()


def test_images_as_bytes_and_pil_images_are_checked_whole_and_named_by_their_row():
    good, bad = _png(shape_image("green")), damaged_body(_png(shape_image("green")))
    row = {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}], "images": [good, bad]}
    with pytest.raises(ValueError, match="dataset row 1 message 0, image 2 of the 'images' column: an image given as bytes "
                                         "cannot be decoded"):
        examples_from_dataset(datasets.Dataset.from_list([{**row, "images": [good, good]}, row]), "dataset")
    pil = ImageRef(image=Image.fromarray(np.full((8, 8), 3.0, np.float32)), where="dataset row 5")
    with pytest.raises(ValueError, match=r"dataset row 5: an image given as a PIL image is refused: it is a float image"):
        pil.check()
    good_png = _png(shape_image("green"))
    lazy = Image.open(io.BytesIO(good_png[: len(good_png) // 2]))  # opened (the header read), not decoded, cut short
    with pytest.raises(ValueError, match="dataset row 6: an image given as a PIL image cannot be decoded .*: its data is "
                                         "damaged or cut short"):
        ImageRef(image=lazy, where="dataset row 6").check()


def test_the_dataset_file_is_left_as_it_was(tmp_path):
    path = write_shapes(tmp_path)
    before = (tmp_path / "shapes.jsonl").read_text()
    _damage(tmp_path / "images" / "0-0.png", "damaged body")
    with pytest.raises(ValueError, match="dataset row 0 message 0, image 1 of the 'images' column"):
        examples_from_dataset(datasets.load_dataset("json", data_files=path, split="train"), "dataset", tmp_path)
    assert (tmp_path / "shapes.jsonl").read_text() == before and json.loads(before.splitlines()[0])["images"] == ["images/0-0.png"]
