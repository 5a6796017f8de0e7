"""Vision-language students and teachers of one family (a tiny Qwen2-VL built here): rows with images train with
gkd (seq_kd included), on_policy and sft; the vision tower stays frozen; the teacher reads the student's pixels;
image tokens are never sampled; errors name the row before any model loads."""

from __future__ import annotations

import json
import re

import pytest
import torch

from distill import DistillConfig
from distill.training.trainer import Distiller
from tests.helpers.training import FAST
from tests.models.vision.models import save_qwen_vl, shape_image

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


def test_rows_with_images_and_a_text_only_model_fail_naming_the_row(tmp_path, vl_dirs, model_dirs, monkeypatch):
    from tests.helpers.training import forbid_model_loading

    with monkeypatch.context() as patched:  # a student directory's config.json says it: before any model loads
        forbid_model_loading(patched)
        with pytest.raises(ValueError, match=r"row 0 shows 1 image\(s\), and the student .* is a text-only model"):
            Distiller(_config(tmp_path, vl_dirs, student=str(model_dirs["student"]), teacher=str(model_dirs["teacher"])))
    with pytest.raises(ValueError, match=r"row 0 shows 1 image\(s\), and the student .* is a text-only model"):
        Distiller(_config(tmp_path, vl_dirs, student=str(model_dirs["student"]), teacher=str(model_dirs["teacher"]))).setup()
    with pytest.raises(ValueError, match="the teacher .* is a text-only model"):
        Distiller(_config(tmp_path / "b", vl_dirs, teacher=str(model_dirs["teacher"]), method="on_policy")).setup()


def _vl_step_gradient(rank, world_size, tmp, batch, accumulation):
    """Step 0's gradient of gkd on dataset completions (lmbda 0) over the shapes rows (0, 1 or 2 images each)."""
    from pathlib import Path

    from tests.distributed import first_step_gradient

    torch.manual_seed(0)
    dirs = json.loads((Path(tmp).parent / "dirs.json").read_text())
    config = _config(Path(tmp) / f"rank{rank}", dirs, lmbda=0.0, max_grad_norm=0.0, per_device_train_batch_size=batch,
                     gradient_accumulation_steps=accumulation)
    return first_step_gradient(Distiller(config))


@pytest.mark.slow
def test_the_gradient_with_images_is_split_invariant_across_processes(tmp_path, vl_dirs):
    from tests.distributed import check_split_invariance

    (tmp_path / "dirs.json").write_text(json.dumps(vl_dirs))
    check_split_invariance(_vl_step_gradient, tmp_path, ("loss", "forward_kl", "completion_length", "grad_norm"))


@pytest.mark.slow
def test_a_run_with_images_killed_and_resumed_matches_an_uninterrupted_one(tmp_path, vl_dirs):
    import sys

    from safetensors.torch import load_file

    from tests.helpers.training import kill_resume_and_compare

    def command(run_dir):
        return [sys.executable, "-m", "distill", "train", "gkd", "--teacher", vl_dirs["teacher"], "--student", vl_dirs["student"],
                "--dataset", vl_dirs["data"], "--output_dir", str(run_dir), "--max_steps", "6", "--save_steps", "1",
                "--logging_steps", "1", "--lmbda", "0.5", "--seq_kd", "true", "--lmbda_schedule", "constant",
                "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_prompt_length", "64",
                "--max_new_tokens", "6", "--eval_before_after", "false", "--progress_bar", "false", "--learning_rate", "1e-3"]

    straight, _ = kill_resume_and_compare(command, tmp_path, 3)
    # The final model is a vision-language model with its processor: it loads back and reads images.
    from distill.models.kinds import model_kind_of
    from distill.teachers.build import load_model

    model, tokenizer = load_model(str(straight / "model"), "student")
    assert model_kind_of(model).name == "vision_language" and tokenizer.eos_token == "<|im_end|>"
    weights = load_file(str(straight / "model" / "model.safetensors"))
    assert any("visual" in name for name in weights)


def test_lora_adapters_go_on_the_language_model_only_and_layer_dropping_applies_to_it(tmp_path, vl_dirs):
    run = Distiller(_config(tmp_path, vl_dirs, method="on_policy", use_peft=True, lora_target_modules=["q_proj", "v_proj", "proj"]))
    adapted = [n for n, _ in run.student_model.named_modules() if n.endswith("lora_A")]
    assert adapted and all("language_model" in n for n in adapted)  # the vision blocks' `proj` is left alone
    assert run.train()["steps"] == 2
    dropped = Distiller(_config(tmp_path / "b", vl_dirs, method="on_policy", student=None, student_init="drop_every:3"))
    text = dropped.student_model.config.get_text_config()
    assert text.num_hidden_layers == 2 and len(dropped.student_model.model.language_model.layers) == 2  # 3 layers, 1 dropped
    assert dropped.train()["steps"] == 2


def _rows_with(vl_dirs, **columns):
    """The shapes rows with more columns (a function of the row: privileged context, answers)."""
    rows = [json.loads(line) for line in open(vl_dirs["data"])]
    for i, row in enumerate(rows):
        row.update({name: make(row, i) for name, make in columns.items()})
    return rows


def test_self_distillation_shows_the_rows_images_to_the_self_teacher(tmp_path, vl_dirs, monkeypatch):
    """sdft and sdpo: the teacher prompt (privileged context, a reprompt) keeps the row's images, placeholders
    expanded like the student's, and the self-teacher's forward reads the same pixel values."""
    from pathlib import Path

    from distill.methods.self_teacher_prompts import fill
    from distill.models.vision import processor_of

    rows = _rows_with(vl_dirs, privileged_context=lambda row, i: f"The shape is {row['completion']}.",
                      answer=lambda row, i: row["completion"])
    data = Path(vl_dirs["data"]).parent / "self.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    filled = fill("{prompt} Hint: {privileged_context}", rows[0]["prompt"], "red")
    assert filled[0]["content"][0] == {"type": "image"} and filled[0]["content"][-1]["text"].endswith("Hint: red")
    fast = {k: v for k, v in FAST.items() if k not in GKD_ONLY}
    base = {**fast, "student": vl_dirs["student"], "dataset": str(data), "max_prompt_length": 64}
    sdft = Distiller(DistillConfig(**base, method="sdft", output_dir=str(tmp_path / "sdft"), max_teacher_prompt_length=160))
    example = sdft.parts.train_examples[2]  # two images
    ids, cut, own_inputs = sdft.teacher.teacher_prompt(example)
    placeholder = sdft.student_model.config.image_token_id
    assert not cut and own_inputs is None and ids.count(placeholder) == sdft.parts.encoded[2].prompt_ids.count(placeholder) == 8
    assert processor_of(sdft.student_model) is not None
    assert sdft.train()["steps"] == 2
    sdpo = Distiller(DistillConfig(**base, method="sdpo", output_dir=str(tmp_path / "sdpo"), num_generations=2,
                                   reward_funcs=["contains_answer"], max_reprompt_length=160))
    assert sdpo.train()["steps"] == 2


def test_an_image_damaged_after_the_start_checks_stops_the_run_at_its_step_with_the_resume_command(tmp_path, vl_dirs,
                                                                                                    monkeypatch, capsys):
    """Its file decodes at the start checks and is damaged right after: the step that needs it checkpoints and
    stops (exit 3, a step failure) naming the row, the image and `distill train --resume`; restored, the run resumes
    and ends with the weights of a run that never failed."""
    from safetensors.torch import load_file

    from distill.cli import main
    from distill.images import ImageRef
    from tests.helpers.images import damaged_body

    data = write_shapes(tmp_path / "data")
    image = tmp_path / "data" / "images" / "2-1.png"
    good = image.read_bytes()

    def train(run_dir) -> int:
        return main(["train", "gkd", "--teacher", vl_dirs["teacher"], "--student", vl_dirs["student"], "--dataset", data,
                     "--output_dir", str(run_dir), "--max_steps", "2", "--logging_steps", "1", "--lmbda", "0.5",
                     "--lmbda_schedule", "constant", "--learning_rate", "1e-3",
                     "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_prompt_length", "64",
                     "--max_new_tokens", "6", "--eval_before_after", "false", "--progress_bar", "false"])

    assert train(tmp_path / "straight") == 0
    checked = ImageRef.check

    def damaged_once_checked(self):
        size = checked(self)
        if self.path == str(image) and image.read_bytes() == good:
            image.write_bytes(damaged_body(good))
        return size

    with monkeypatch.context() as patched:
        patched.setattr(ImageRef, "check", damaged_once_checked)
        capsys.readouterr()
        assert train(tmp_path / "failed") == 3
    error = capsys.readouterr().err
    assert re.search(r"dataset row 2 message 0, image 2 of the 'images' column: image .*2-1.png cannot be decoded .*; it "
                     r"decoded when the run started, so it changed during the run: restore it\nThe run is checkpointed at step "
                     r"\d \(.*\); once the image is restored, continue with `distill train --resume .*failed`", error), error
    image.write_bytes(good)
    assert main(["train", "--resume", str(tmp_path / "failed")]) == 0
    expected = load_file(str(tmp_path / "straight" / "model" / "model.safetensors"))
    actual = load_file(str(tmp_path / "failed" / "model" / "model.safetensors"))
    assert expected.keys() == actual.keys() and all(torch.equal(expected[name], actual[name]) for name in expected)


def test_the_evaluation_shows_each_row_its_images(tmp_path, vl_dirs):
    """The evaluation's prompts are the rows' own, image tokens expanded as in training, and a run with images and an
    evaluation set with answers reports the answer accuracy before and after."""
    from pathlib import Path

    from distill.data import examples_from_dataset
    from distill.data_files import load_dataset_spec
    from distill.models.kinds import model_kind_of
    from distill.teachers.build import load_model

    rows = _rows_with(vl_dirs, answer=lambda row, i: row["completion"])
    data = Path(vl_dirs["data"]).parent / "with_answers.jsonl"  # beside the images its rows name
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    model, tokenizer = load_model(vl_dirs["student"], "student")
    renderer = model_kind_of(model).encoder(tokenizer, 64, 6, [tokenizer.eos_token_id], model)
    examples = examples_from_dataset(load_dataset_spec(str(data), "train", "eval_dataset"), "eval_dataset", data.parent)
    assert any(example.images for example in examples)
    for example in examples:
        assert renderer.prompt(example).ids == renderer.row(example).prompt_ids

    config = _config(tmp_path, vl_dirs, eval_before_after=True, eval_dataset=str(data), eval_split="train", eval_max_prompts=4)
    metrics = Distiller(config).train()["eval"]
    assert metrics["before"]["answer_accuracy"]["prompts"] == 4 == metrics["after"]["answer_accuracy"]["prompts"]
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    assert report["teacher"]["answer_accuracy"]["prompts"] == 4  # the teacher's greedy answers, beside the student's
    assert "Answer accuracy (greedy answer contains the row's answer): teacher " in (tmp_path / "run" / "eval" / "eval.md").read_text()
