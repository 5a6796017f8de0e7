"""Vision-language students and teachers of one family (a tiny Qwen2-VL built here): rows with images train with
gkd (seq_kd included), on_policy and sft; the vision tower stays frozen; the teacher reads the student's pixels;
image tokens are never sampled; errors name the row before any model loads."""

from __future__ import annotations

import json

import pytest
import torch

from distill import DistillConfig
from distill.training.trainer import Distiller
from tests.train.helpers import FAST
from tests.vision.models import save_qwen_vl, shape_image

GKD_ONLY = ("seq_kd", "lmbda_schedule")
COLOURS = ("red", "green", "blue")
SHAPES = ("square", "circle", "triangle")


def write_shapes(directory, n: int = 8) -> str:
    """A JSON Lines dataset of coloured shapes, its images as PNG files beside it (relative paths); every third row
    shows two images and every fourth none, so rows with different numbers of images share batches."""
    (directory / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        colour, shape = COLOURS[i % 3], SHAPES[(i // 3) % 3]
        images = []
        count = 0 if i % 4 == 3 else (2 if i % 3 == 2 else 1)
        for k in range(count):
            name = f"images/{i}-{k}.png"
            shape_image(colour, shape).save(directory / name)
            images.append(name)
        blocks = [{"type": "image"}] * count + [{"type": "text", "text": "What colour is the shape?"}]
        rows.append({"prompt": [{"role": "user", "content": blocks}], "images": images, "completion": colour})
    path = directory / "shapes.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.fixture(scope="module")
def vl_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("vl")
    return {"teacher": str(save_qwen_vl(root / "teacher", layers=3, seed=1)),
            "student": str(save_qwen_vl(root / "student", layers=2, seed=2)),
            "data": write_shapes(root / "data")}


def _config(tmp_path, vl_dirs, **overrides) -> DistillConfig:
    fast = FAST if overrides.get("method", "gkd") == "gkd" else {k: v for k, v in FAST.items() if k not in GKD_ONLY}
    values = {**fast, "output_dir": str(tmp_path / "run"), "teacher": vl_dirs["teacher"], "student": vl_dirs["student"],
              "dataset": vl_dirs["data"], "max_prompt_length": 64, **overrides}
    if values.get("method") == "sft":
        del values["teacher"]  # it learns from the dataset's completions
    return DistillConfig(**values)


def _vision(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if ".visual." in f".{n}"}


def _language(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "language_model" in n}


@pytest.mark.parametrize("overrides", [dict(method="gkd", lmbda=0.5, seq_kd=True), dict(method="on_policy"),
                                       dict(method="iw_opd"), dict(method="sft")],
                         ids=["gkd-seq_kd", "on_policy", "iw_opd", "sft"])
def test_a_vision_language_pair_trains_on_rows_with_images(tmp_path, vl_dirs, overrides):
    run = Distiller(_config(tmp_path, vl_dirs, **overrides))
    run.setup()
    vision, language = _vision(run.student_model), _language(run.student_model)
    assert vision and language
    assert not any(p.requires_grad for n, p in run.student_model.named_parameters() if n in vision)
    result = run.train()
    assert result["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(line["loss"])) for line in lines if "loss" in line)
    after = dict(run.student_model.named_parameters())
    assert all(torch.equal(vision[n], after[n]) for n in vision)  # the vision tower is frozen by default
    assert any(not torch.equal(language[n], after[n]) for n in language)


def test_train_vision_tower_trains_it_and_is_refused_for_a_text_student(tmp_path, vl_dirs, model_dirs):
    run = Distiller(_config(tmp_path, vl_dirs, method="sft", train_vision_tower=True))
    run.setup()
    vision = _vision(run.student_model)
    run.train()
    after = dict(run.student_model.named_parameters())
    assert any(not torch.equal(vision[n], after[n]) for n in vision)
    with pytest.raises(ValueError, match="train_vision_tower: the student is not a vision-language model"):
        Distiller(_config(tmp_path / "text", vl_dirs, method="on_policy", dataset="bundled", train_vision_tower=True,
                          teacher=str(model_dirs["teacher"]), student=str(model_dirs["student"]))).setup()


def test_rows_with_images_and_a_text_only_model_fail_naming_the_row(tmp_path, vl_dirs, model_dirs):
    with pytest.raises(ValueError, match=r"row 0 shows 1 image\(s\), and the student .* is a text-only model"):
        Distiller(_config(tmp_path, vl_dirs, student=str(model_dirs["student"]), teacher=str(model_dirs["teacher"]))).setup()
    with pytest.raises(ValueError, match="the teacher .* is a text-only model"):
        Distiller(_config(tmp_path / "b", vl_dirs, teacher=str(model_dirs["teacher"]), method="on_policy")).setup()
