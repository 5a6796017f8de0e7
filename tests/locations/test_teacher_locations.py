"""A teacher location is a part: one defined only in this file trains, evaluates and resumes.

The toy teacher is a fixed function of the input ids: at each position its next-token logits are a fixed
random head applied to a fixed random vector of the current token. It lives nowhere distill knows of;
registering it (`register_location`) is the only step, and `teacher: "fixed:SEED"` selects it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file

from distill.cli import main
from distill.config import DistillConfig
from distill.config.io import PartFields, setting
from distill.locations import (
    TeacherLocation,
    Teachers,
    location_of,
    register_location,
    unregister_location,
)
from distill.losses import LogitHead
from distill.methods import get_method
from distill.registry import Reads
from distill.signals import DENSE, DenseSignal
from distill.teachers.base import Teacher
from distill.teachers.hidden import predicting_positions
from tests.conftest import chat_rows

PREFIX = "fixed:"


class FixedTeacher(Teacher):
    """Logits at a position = head(table[token]): the same for the same token, whatever its context."""

    can_generate = False  # it only scores (like a server): the evaluation samples the student alone
    aligned = False

    def __init__(self, vocab_size: int, seed: int, width: int = 8):
        generator = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab_size, width, generator=generator)
        self.head = LogitHead(3.0 * torch.randn(vocab_size, width, generator=generator))
        self.scored, self.closed = 0, False

    def close(self) -> None:
        self.closed = True

    def score(self, batch, temperature: float) -> DenseSignal:
        self.scored += 1
        tokens = batch.input_ids[:, :-1][predicting_positions(batch.completion_mask)]
        return DenseSignal(self.table[tokens.cpu()].to(batch.input_ids.device), self.head)


@dataclass
class FixedFields(PartFields):
    """The toy location's own settings: composed into the config while it is registered."""

    fixed_teacher_width: int = setting(8, "Width of the fixed teacher's per-token vectors (the toy location's setting).")


class StepsSeen:
    """What the location checkpoints: the optimizer steps its teacher has seen (restored on resume)."""

    name = "fixed_teacher_steps"

    def __init__(self):
        self.steps = 0

    def after_optimizer_step(self, step: int) -> None:
        self.steps += 1

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


class FixedFunctionLocation(TeacherLocation):
    name = "fixed"
    fields = (FixedFields,)
    student_origin = "the given student"

    def __init__(self) -> None:
        self.built: list[FixedTeacher] = []
        self.counters: list[StepsSeen] = []
        self.reads = (Reads("a fixed-function teacher (teacher: fixed:SEED)", ("teacher",),
                            lambda config: str(config.teacher).startswith(PREFIX)),)

    def claims(self, config, method) -> bool:
        return method.teacher == "external" and str(config.teacher).startswith(PREFIX)

    def signal_kind(self, method, config) -> str:
        return DENSE

    def validate(self, config, method, sources) -> None:
        if "teacher" in sources:
            raise ValueError("seq_kd: a fixed-function teacher cannot write completions; set seq_kd: false")
        if not config.teacher.removeprefix(PREFIX).isdigit():
            raise ValueError(f"teacher: write fixed:SEED with an integer seed, got {config.teacher!r}")

    def card_title(self, record: dict) -> str:
        return f"# Student distilled from the fixed function {record['teacher']}"

    def eval_values(self, method, values: dict, record: dict, args) -> dict:
        return values  # the run's own teacher scores again

    def build(self, request) -> Teachers:
        width = FixedFields.of(request.config).fixed_teacher_width
        teacher = FixedTeacher(request.vocab_size, int(request.config.teacher.removeprefix(PREFIX)), width)
        self.built.append(teacher)
        return Teachers(teacher, teacher)

    def hooks(self, teachers: Teachers) -> list:
        self.counters.append(StepsSeen())
        return [self.counters[-1]]


@pytest.fixture
def fixed_location():
    location = register_location(FixedFunctionLocation())
    yield location
    unregister_location(location.name)


def _recipe(tmp_path, model_dirs, name: str, **fields) -> str:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"prompt": row["prompt"]}) + "\n" for row in chat_rows(3, seed=5)))
    values = {"teacher": "fixed:7", "student": str(model_dirs["student"]), "dataset": str(data), "eval_dataset": str(heldout),
              "eval_split": "train", "max_steps": 4, "save_steps": 2, "logging_steps": 1, "max_new_tokens": 6,
              "eval_max_new_tokens": 6, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1,
              "lmbda": 0.5, "seq_kd": False, "learning_rate": 1e-2, "lr_scheduler_type": "constant", "warmup_ratio": 0.0,
              "progress_bar": False, **fields}
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items()))
    return str(recipe)


def test_the_location_is_chosen_and_checked_like_a_built_in_one(fixed_location):
    config = DistillConfig(teacher="fixed:7", student="s", seq_kd=False).validate()
    assert location_of(config, get_method("gkd")) is fixed_location
    with pytest.raises(ValueError, match="fixed:SEED with an integer seed"):
        DistillConfig(teacher="fixed:x", student="s", seq_kd=False).validate()
    with pytest.raises(ValueError, match="cannot write completions"):
        DistillConfig(teacher="fixed:7", student="s", seq_kd=True).validate()
    with pytest.raises(ValueError, match="takes no teacher model"):  # a self-teacher method: the self location claims it
        DistillConfig(method="sdft", teacher="fixed:7").validate()


def test_a_location_defined_in_a_test_file_trains_evaluates_and_resumes(tmp_path, model_dirs, fixed_location, capsys):
    straight = tmp_path / "straight"
    assert main(["train", _recipe(tmp_path, model_dirs, "straight"), "--output-dir", str(straight)]) == 0
    assert fixed_location.built and all(teacher.scored > 0 and teacher.closed for teacher in fixed_location.built)
    assert fixed_location.counters[-1].steps == 4
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["loss"] > 0 for r in records)
    initial = load_file(str(model_dirs["student"] / "model.safetensors"))
    trained = load_file(str(straight / "model" / "model.safetensors"))
    assert any(not torch.equal(initial[name], trained[name]) for name in initial)
    card = (straight / "model" / "README.md").read_text()
    assert "# Student distilled from the fixed function fixed:7" in card

    # `distill eval` builds the same teacher from the run's config and reproduces the run's own evaluation.
    assert main(["eval", str(straight), "--out", str(tmp_path / "eval")]) == 0
    again = json.loads((tmp_path / "eval" / "eval.json").read_text())["metrics"]["student"]["on_student_completions"]
    after = json.loads((straight / "eval" / "eval.json").read_text())["metrics"]["after"]["on_student_completions"]
    assert again["reverse_kl"] == pytest.approx(after["reverse_kl"], rel=1e-5)

    # Stopped at step 2 and resumed to 4: the same weights as the uninterrupted run, bit for bit.
    resumed = tmp_path / "resumed"
    assert main(["train", _recipe(tmp_path, model_dirs, "resumed", max_steps=2), "--output-dir", str(resumed)]) == 0
    assert main(["train", "--resume", str(resumed), "--max_steps", "4"]) == 0
    assert fixed_location.counters[-1].steps == 4  # 2 restored from the checkpoint, 2 after
    final = load_file(str(resumed / "model" / "model.safetensors"))
    for name, weight in trained.items():
        assert torch.equal(weight, final[name]), name


def test_a_locations_own_settings_come_from_yaml_and_flags_and_leave_with_it(tmp_path, model_dirs, fixed_location):
    """A location declares its settings (`fields`): they are config fields while it is registered, read only while it
    holds the teacher, set from a recipe and overridden by a flag, and gone once it is unregistered."""
    config = DistillConfig(teacher="fixed:7", student="s", seq_kd=False, fixed_teacher_width=4).validate()
    assert FixedFields.of(config).fixed_teacher_width == 4
    with pytest.raises(ValueError, match="fixed_teacher_width is only read with the fixed teacher location"):
        DistillConfig(student="s", fixed_teacher_width=4).validate()

    recipe = _recipe(tmp_path, model_dirs, "widths", max_steps=1, fixed_teacher_width=4)
    assert main(["train", recipe, "--output-dir", str(tmp_path / "run"), "--fixed-teacher-width", "3"]) == 0
    assert fixed_location.built[-1].table.shape[1] == 3  # the flag over the recipe
    assert "fixed_teacher_width: 3" in (tmp_path / "run" / "config.yaml").read_text()

    unregister_location(fixed_location.name)
    assert "fixed_teacher_width" not in DistillConfig.field_names()
    register_location(fixed_location)  # the fixture unregisters it


def test_a_duck_typed_teacher_is_refused_and_a_teacher_is_not_frozen_unless_it_says_so():
    class Unfrozen(Teacher):
        def score(self, batch, temperature):
            raise AssertionError("not scored here")

    class DuckTyped:
        can_generate = False

        def score(self, batch, temperature):
            raise AssertionError("not scored here")

    assert Unfrozen().frozen is False and Unfrozen().can_generate is False
    with pytest.raises(TypeError, match="cannot sample"):
        Unfrozen().generate([[1]], None)
    assert Teachers(Unfrozen(), None).train is not None
    with pytest.raises(TypeError, match="DuckTyped, which is not a distill.teachers.base.Teacher"):
        Teachers(DuckTyped(), None)
