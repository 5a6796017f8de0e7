"""Images in dataset rows: where each one is (`ImageRef`), checking it by decoding it once, and the chat messages
that show it (content blocks).

A row shows images through content blocks in its chat messages, as transformers' chat templates take them:
`{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is it?"}]}`. A bare
`{"type": "image"}` block takes the row's next image from its `images` column (in order); a block may name its
own instead (`{"type": "image", "image": ...}`, or `"path"`). An image is a file path (relative paths start at the
folder of the dataset file, or the dataset folder), raw bytes, a `{"bytes", "path"}` mapping (a `datasets.Image`
column read without decoding) or a PIL image.

Each image is decoded fully once when the rows are read (`ImageRef.check`: PIL's `verify` then `load`, and the
conversion to what a viewer shows, `distill.image_modes.viewer_rgb`), and dropped: a missing, damaged or unreadable
image, or one of a mode distill refuses, fails naming its row before any model loads, and the size it is shown at
is known. `ImageRef.load` decodes it again when a micro-batch needs its pixels; an image that decoded at the start
and no longer does (or decodes to another size) was changed during the run: `ImageChangedError`, a step failure
(the run checkpoints and says how to resume).
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, TypeGuard

from distill.errors import ImageChangedError
from distill.image_modes import RefusedImage, viewer_rgb

IMAGE_BLOCK = "image"
TEXT_BLOCK = "text"
# distill's extension of a teacher server's requests: per prompt, its images as base64 PNG (stock vLLM has none).
IMAGES_FIELD = "distill_images"
CHANGED = "it decoded when the run started, so it changed during the run: restore it"


@dataclass(frozen=True)
class ImageRef:
    """One image of a row, not decoded: a file (`path`), encoded bytes (`data`) or a PIL image held in memory.
    `where`: the row and place that show it ("dataset row 3 message 0, image 1 of the 'images' column"), named by
    every error about it."""

    path: str | None = None
    data: bytes | None = field(default=None, repr=False)
    image: Any = field(default=None, repr=False, compare=False)  # a PIL image given in the dataset
    where: str = field(default="", compare=False)

    def describe(self) -> str:
        if self.path is not None:
            return f"image {self.path}"
        return "an image given as bytes" if self.data is not None else "an image given as a PIL image"

    def _error(self, problem: str) -> str:
        return f"{self.where}: {self.describe()} {problem}" if self.where else f"{self.describe()} {problem}"

    def check(self) -> tuple[int, int]:
        """Decode the image fully (as `load` does) and drop it; (width, height) as it is shown (after its EXIF
        orientation). Raises ValueError naming the row, the image and the fix when it is missing, not an image,
        damaged, or of a mode distill refuses (`viewer_rgb`). Done once: later calls give the same size."""
        return self.shown_size

    @cached_property
    def shown_size(self) -> tuple[int, int]:
        """(width, height) of the image as shown, from one full decode (remembered: `check`)."""
        width, height = self._decode().size
        return int(width), int(height)

    def load(self):
        """The decoded image in 8-bit RGB, as a viewer shows it (what image processors take). For an image checked
        at the start, a failure now, or another size, means its file changed during the run: `ImageChangedError`
        (a step failure: the run checkpoints and stops); for one never checked, the ValueError of `check`."""
        checked = self.__dict__.get("shown_size")
        try:
            image = self._decode(during_run=checked is not None)
        except ValueError as error:
            if checked is None:
                raise
            raise ImageChangedError(str(error)) from None
        if checked is not None and tuple(image.size) != checked:
            raise ImageChangedError(self._error(f"decodes to {image.size[0]}x{image.size[1]} pixels, and to "
                                                f"{checked[0]}x{checked[1]} when the run started (it was replaced during "
                                                "the run); restore it"))
        return image

    def digest(self) -> str:
        """A digest of the decoded pixels (size and RGB bytes): the same picture gives the same digest whatever
        file or format holds it (caches key on it)."""
        image = self.load()
        hasher = hashlib.sha256(f"{image.size[0]}x{image.size[1]}".encode())
        hasher.update(image.tobytes())
        return hasher.hexdigest()

    def _decode(self, during_run: bool = False):
        """The image in 8-bit RGB as shown (`viewer_rgb`): a file or bytes checked whole first (PIL's `verify`:
        a PNG's chunk checksums, say), then decoded whole; ValueError naming the row, the image and the fix (with
        `during_run`, the fix for an image that decoded at the start: restore it)."""
        from PIL import Image

        def failure(problem: str, fix: str) -> ValueError:
            return ValueError(self._error(f"{problem}; {CHANGED if during_run else fix}"))

        if self.image is not None:
            try:
                self.image.load()  # a PIL image opened from a file and not decoded yet decodes here
            except Exception as error:
                raise failure(f"cannot be decoded ({type(error).__name__}: {error}): its data is damaged or cut short",
                              "give an image that decodes") from None
            return self._shown(self.image, failure)
        try:
            opened = self._open()  # the header: raises here for a missing file, or one that is no image
        except FileNotFoundError:
            raise failure("does not exist", "give the path of an image file") from None
        except Image.DecompressionBombError as error:
            raise failure(f"is refused ({error})", "give a smaller image") from None
        except Exception as error:  # PIL.UnidentifiedImageError, a truncated header, a directory
            raise failure(f"cannot be read as an image ({type(error).__name__}: {error})", "give an image file PIL reads "
                          "(PNG, JPEG, WebP, GIF, TIFF, BMP, ...)") from None
        try:
            with opened:
                opened.verify()
            decoded = self._open()
            decoded.load()
        except Exception as error:  # a body that does not decode: cut short, a wrong checksum, not what its header says
            raise failure(f"cannot be decoded ({type(error).__name__}: {error}): its data is damaged or cut short",
                          "replace it with a good copy, or drop the row") from None
        with decoded:
            return self._shown(decoded, failure)

    def _open(self):
        from PIL import Image

        if self.data is not None:
            return Image.open(io.BytesIO(self.data))
        assert self.path is not None
        return Image.open(self.path)

    @staticmethod
    def _shown(image, failure):
        try:
            return viewer_rgb(image)
        except RefusedImage as error:
            raise failure(f"is refused: {error.reason}", error.fix) from None


def image_ref(value: Any, root: Path | None, where: str) -> ImageRef:
    """The `ImageRef` of one image as a dataset row gives it (module docstring), shown at `where` (the row and the
    place in it, named by its errors); raises ValueError naming `where`."""
    if isinstance(value, ImageRef):
        return value
    if isinstance(value, (bytes, bytearray)):
        return ImageRef(data=bytes(value), where=where)
    if isinstance(value, dict) and ("bytes" in value or "path" in value):
        if value.get("bytes") is not None:
            return ImageRef(path=value.get("path"), data=bytes(value["bytes"]), where=where)
        value = value.get("path")
    if isinstance(value, (str, Path)) and str(value).strip():
        text = str(value)
        if text.startswith(("http://", "https://")):
            raise ValueError(f"{where}: image {text} is a URL; distill reads local files only (download it and give its path)")
        path = Path(text).expanduser()
        if not path.is_absolute() and root is not None:
            path = root / path
        return ImageRef(path=str(path), where=where)
    if hasattr(value, "size") and hasattr(value, "convert"):  # a PIL image
        return ImageRef(image=value, where=where)
    raise ValueError(f"{where}: an image must be a file path, bytes, a {{'bytes', 'path'}} mapping or a PIL image, "
                     f"got {type(value).__name__}")


def is_block_list(content: Any) -> TypeGuard[list]:
    """Whether a message's content is a list of content blocks (rather than text)."""
    return isinstance(content, list)


def check_blocks(content: list, where: str) -> int:
    """Validate a message's content blocks; the number of image blocks."""
    if not content:
        raise ValueError(f"{where}: a message's content blocks are empty; give at least one text or image block")
    images = 0
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == TEXT_BLOCK:
            if not isinstance(block.get("text"), str):
                raise ValueError(f"{where}: a text block needs 'text' (a string), got {block!r}")
        elif kind == IMAGE_BLOCK:
            images += 1
        else:
            raise ValueError(f"{where}: a content block must be {{'type': 'text', 'text': ...}} or {{'type': 'image'}}, "
                             f"got {block!r}")
    return images


def text_of_blocks(content: list) -> str:
    """The text of content blocks with no image (what chat templates render for them: the texts, in order)."""
    return "".join(block["text"] for block in content)


def row_images(messages: list[dict], column: list | tuple | None, root: Path | None, where: str) -> tuple[list[dict], tuple[ImageRef, ...]]:
    """(messages with each image block bare, the row's images in the order the blocks show them).

    A bare image block takes the next image of the `images` column; every image of the column must be shown by
    one block. Messages whose blocks hold no image become plain text."""
    column_images = _ColumnImages(column, "images")
    refs: list[ImageRef] = []
    out = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not is_block_list(content):
            out.append(message)  # text, or malformed (reported by the row's message checks)
            continue
        if check_blocks(content, f"{where} message {i}") == 0:
            out.append({**message, "content": text_of_blocks(content)})
            continue
        if message.get("role") != "user" and message.get("role") != "system":
            raise ValueError(f"{where} message {i}: the {message.get('role')!r} turn shows an image; images go in user "
                             "(or system) turns of the prompt")
        blocks, shown = _bare_blocks(content, column_images, root, f"{where} message {i}", where)
        refs.extend(shown)
        out.append({**message, "content": blocks})
    column_images.check_all_shown(where)
    return out, tuple(refs)


def context_images(value: str | list, column: list | tuple | None, root: Path | None, where: str
                   ) -> tuple[str | list[dict], tuple[ImageRef, ...]]:
    """A privileged context (text, or content blocks that may show images) as (text or bare blocks, its images in
    order). A bare image block takes the next image of the `privileged_images` column. Blocks without an image
    become text."""
    column_images = _ColumnImages(column, "privileged_images")
    if is_block_list(value) and check_blocks(value, where):
        blocks, refs = _bare_blocks(value, column_images, root, where, where)
        column_images.check_all_shown(where)
        return blocks, tuple(refs)
    column_images.check_all_shown(where)
    return (text_of_blocks(value) if is_block_list(value) else value), ()


class _ColumnImages:
    """The images of a row's column (`images`, `privileged_images`), handed out in order to its bare image blocks."""

    def __init__(self, column: list | tuple | None, name: str):
        self.pending, self.used, self.name = list(column or []), 0, name

    def next(self, where: str) -> tuple[Any, str]:
        """The next image of the column, and where it is in the row ("image 2 of the 'images' column")."""
        if self.used >= len(self.pending):
            raise ValueError(f"{where}: its content blocks show {self.used + 1} or more images from the '{self.name}' column, which "
                             f"holds {len(self.pending)}; give one image per {{'type': 'image'}} block")
        self.used += 1
        return self.pending[self.used - 1], f"image {self.used} of the '{self.name}' column"

    def check_all_shown(self, where: str) -> None:
        if self.used < len(self.pending):
            raise ValueError(f"{where}: the '{self.name}' column holds {len(self.pending)} images and its content "
                             f"blocks show {self.used}; add an {{'type': 'image'}} content block where each image goes")


def _bare_blocks(content: list, column: _ColumnImages, root: Path | None, where: str, row: str
                 ) -> tuple[list[dict], list[ImageRef]]:
    """Checked content blocks with each image block bare, and the images they show (their own, or the column's)."""
    blocks: list[dict] = []
    refs: list[ImageRef] = []
    for block in content:
        if block["type"] != IMAGE_BLOCK:
            blocks.append({"type": TEXT_BLOCK, "text": block["text"]})
            continue
        key = next((key for key in ("image", "path") if block.get(key) is not None), None)
        value, place = column.next(row) if key is None else (block[key], f"the '{key}' of its image block")
        refs.append(image_ref(value, root, f"{where}, {place}"))
        blocks.append({"type": IMAGE_BLOCK})
    return blocks, refs
