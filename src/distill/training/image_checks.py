"""Rows with images against the models that would read them: a text-only student refused before it loads (from its
config.json), and once loaded every model that sees the rows' images checked to read them."""

from __future__ import annotations

import json
from pathlib import Path

from torch import nn

from distill.data import Example
from distill.locations import TeacherLocation
from distill.methods.base import Method
from distill.models.vision import image_token_ids, is_vision_language


def check_images_before_loading(examples: list[Example], student) -> None:
    """Rows with images and a student directory whose config.json has no vision_config (a text-only model): the
    error `check_images` gives, before any model loads (a model object, GGUF or hub id is checked once loaded)."""
    shown = next((e for e in examples if e.images or e.privileged_images), None)
    if shown is None or not isinstance(student, str) or not (Path(student).expanduser() / "config.json").is_file():
        return
    config = json.loads((Path(student).expanduser() / "config.json").read_text(encoding="utf-8"))
    if isinstance(config, dict) and "vision_config" not in config:
        raise ValueError(f"{_showing(shown)}, and the student ({student}: "
                         f"{config.get('model_type', 'a model')}) is a text-only model; give a vision-language student (an "
                         "image-text-to-text model) or drop the images")


def _showing(example: Example) -> str:
    """"row N shows K image(s)": its prompt's and its privileged context's, said apart."""
    row, prompt, privileged = example.index, len(example.images), len(example.privileged_images)
    if not privileged:
        return f"row {row} shows {prompt} image(s)"
    if not prompt:
        return f"row {row} shows {privileged} image(s) in its privileged_context"
    return f"row {row} shows {prompt} image(s) (and {privileged} in its privileged_context)"


def check_images(examples: list[Example], method: Method, location: TeacherLocation, student: nn.Module,
                 teacher: nn.Module | None, takes_signal: bool) -> None:
    """Rows with images need a vision-language student and, where a teacher scores them, a vision-language teacher
    here: of the same family (it gets the student's ids and pixel values), or of any family with a method whose
    teacher has its own tokenizer (gold: it reads the images through its own processor); raises naming the first
    such row. Images in a privileged context need a vision-language student (the self-teacher is the student)."""
    privileged = next((e for e in examples if e.images or e.privileged_images), None)
    if privileged is not None and not is_vision_language(student):
        raise ValueError(f"{_showing(privileged)}, and the student ({type(student).__name__}) is a text-only model; give "
                         "a vision-language student (an image-text-to-text model) or drop the images")
    shown = next((e for e in examples if e.images), None)
    if shown is None or not takes_signal:
        return
    where = _showing(shown)
    if teacher is None:
        if location.reads_images:
            return  # a server: it must say it reads images before the first request with them
        raise ValueError(f"{where}: the {location.name} teacher does not take images yet (a cache, or the student as its "
                         "own teacher); give a vision-language teacher of the student's family, here or on "
                         "`distill serve-teacher`")
    if not is_vision_language(teacher):
        raise ValueError(f"{where}, and the teacher ({type(teacher).__name__}) is a text-only model; give a vision-language "
                         "teacher of the student's family (it sees the student's pixel values)")
    if method.cross_tokenizer:
        return  # the teacher reads the row's images through its own processor (`CrossTokenizerTeacher`)
    if image_token_ids(teacher) != image_token_ids(student) or type(teacher) is not type(student):
        raise ValueError(f"{where}: the teacher ({type(teacher).__name__}, image tokens {image_token_ids(teacher)}) and "
                         f"the student ({type(student).__name__}, image tokens {image_token_ids(student)}) are not of one "
                         "family, so the teacher cannot read the student's image inputs")
