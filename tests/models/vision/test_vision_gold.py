"""Across families (gold): each model reads a row through its own processor and chat template, and completions are
aligned by bytes on the text. A Qwen2-VL student from a LLaVA teacher (another tokenizer, another image-token scheme,
a CLIP vision tower) on rows with images, seq_kd included; a text-only student from a vision-language teacher, and
the reverse, on text rows."""

from __future__ import annotations

import json

import pytest
import torch

from distill import DistillConfig
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import FAST
from tests.models.vision.models import llava_processor, save_llava, save_qwen_vl, shape_image
from tests.models.vision.test_vision_runs import write_shapes


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("families")
    text = root / "text"
    tiny_lm(len(tokenizer), layers=2, seed=5, eos_token_id=tokenizer.eos_token_id).save_pretrained(text)
    tokenizer.save_pretrained(text)
    texts = root / "texts.jsonl"
    texts.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(8)))
    return {"qwen": str(save_qwen_vl(root / "qwen", layers=2, seed=2)), "llava": str(save_llava(root / "llava", layers=3, seed=1)),
            "text": str(text), "shapes": write_shapes(root / "data"), "texts": str(texts)}


def _gold(tmp_path, student, teacher, dataset, **overrides) -> DistillConfig:
    values = {**FAST, "method": "gold", "output_dir": str(tmp_path / "run"), "teacher": teacher, "student": student,
              "dataset": dataset, "max_prompt_length": 64, "lmbda": 0.5, "lmbda_schedule": "constant", **overrides}
    return DistillConfig(**values)


def test_a_student_of_one_family_learns_from_a_teacher_of_another_on_rows_with_images(tmp_path, family_dirs, monkeypatch):
    from transformers.models.clip import modeling_clip

    seen = []
    forward = modeling_clip.CLIPVisionModel.forward

    def recording(self, pixel_values=None, *args, **kwargs):
        seen.append(pixel_values.detach().clone())
        return forward(self, pixel_values, *args, **kwargs)

    monkeypatch.setattr(modeling_clip.CLIPVisionModel, "forward", recording)
    run = Distiller(_gold(tmp_path, family_dirs["qwen"], family_dirs["llava"], family_dirs["shapes"], seq_kd=True))
    result = run.train()
    assert result["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(line["loss"])) for line in lines if "loss" in line)
    # The teacher read the rows' images through its own processor: CLIP's 28 x 28 crops, never Qwen-VL's patches.
    assert seen and all(p.shape[1:] == (3, 28, 28) for p in seen)
    processor = llava_processor()
    colours = {(c, s) for c in ("red", "green", "blue") for s in ("square", "circle", "triangle")}
    own = [processor.image_processor(images=[shape_image(c, s)], return_tensors="pt")["pixel_values"][0] for c, s in sorted(colours)]
    assert all(any(torch.equal(image, mine) for mine in own) for batch in seen for image in batch)


@pytest.mark.parametrize("student, teacher", [("text", "qwen"), ("qwen", "text")],
                         ids=["text student, VL teacher", "VL student, text teacher"])
def test_text_rows_cross_between_a_text_model_and_a_vision_language_one(tmp_path, family_dirs, student, teacher):
    run = Distiller(_gold(tmp_path, family_dirs[student], family_dirs[teacher], family_dirs["texts"]))
    assert run.train()["steps"] == 2


def test_rows_with_images_and_a_text_only_cross_family_teacher_are_refused(tmp_path, family_dirs):
    with pytest.raises(ValueError, match=r"row 0 shows 1 image\(s\), and the teacher .* is a text-only model"):
        Distiller(_gold(tmp_path, family_dirs["qwen"], family_dirs["text"], family_dirs["shapes"]))
