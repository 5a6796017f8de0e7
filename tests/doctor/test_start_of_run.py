"""The checks at the start of every `distill train`, and `distill doctor`: errors stop a run before it writes
anything, warnings are printed and kept in checks.json (strict_checks stops on them), doctor writes nothing."""

from __future__ import annotations

import json
from collections import namedtuple

from distill.cli import main


def _recipe(tmp_path, model_dirs, **fields) -> str:
    data = tmp_path / "text_prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} + {i}?", "completion": str(2 * i)}) + "\n"
                            for i in range(6)))
    values = {"teacher": str(model_dirs["teacher"]), "student": str(model_dirs["student"]), "dataset": str(data),
              "method": "gkd", "learning_rate": 1e-5, "max_steps": 1, "max_new_tokens": 6, "per_device_train_batch_size": 2,
              "gradient_accumulation_steps": 1, "eval_before_after": False, "progress_bar": False, "save_steps": 0,
              "output_dir": str(tmp_path / "run"), **fields}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items()))
    return str(recipe)


def test_doctor_prints_each_finding_with_its_fix_and_writes_nothing(tmp_path, model_dirs, capsys):
    recipe = _recipe(tmp_path, model_dirs)
    assert main(["doctor", recipe]) == 0
    out = capsys.readouterr().out
    assert "WARNING plain_text_prompts: 6 of 6 dataset rows have a plain-text `prompt`" in out
    assert "fix: give the prompts as chat messages" in out and "INFO    memory: about" in out
    assert "0 error(s), 1 warning(s)" in out
    assert "INFO    step_time: measured step 0 (teacher) " in out and "minutes for 1 steps" in out
    assert not (tmp_path / "run").exists()
    assert main(["doctor", recipe, "--strict_checks", "true"]) == 1
    assert "WARNING plain_text_prompts" in capsys.readouterr().out


def test_train_prints_the_warnings_and_keeps_every_finding_in_the_run(tmp_path, model_dirs, capsys):
    assert main(["train", _recipe(tmp_path, model_dirs)]) == 0
    assert "distill: check [warning] plain_text_prompts: 6 of 6 dataset rows" in capsys.readouterr().err
    findings = json.loads((tmp_path / "run" / "checks.json").read_text())
    assert {f["check"]: f["severity"] for f in findings} == {"plain_text_prompts": "warning", "pad_is_eos": "info",
                                                            "memory": "info"}


def test_strict_checks_stop_a_run_on_a_warning_before_it_writes_anything(tmp_path, model_dirs, capsys):
    assert main(["train", _recipe(tmp_path, model_dirs, strict_checks=True)]) == 2
    err = capsys.readouterr().err
    assert "1 start-of-run check(s) stop this run" in err and "[warning] plain_text_prompts" in err
    assert not (tmp_path / "run").exists()


def test_an_error_finding_stops_the_run_before_it_writes_anything(tmp_path, model_dirs, capsys, monkeypatch):
    import distill.doctor.checks

    monkeypatch.setattr(distill.doctor.checks.psutil, "virtual_memory",
                        lambda: namedtuple("Memory", "total available")(1 << 20, 1 << 19))
    assert main(["train", _recipe(tmp_path, model_dirs)]) == 2
    assert "[error] memory: about" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main(["doctor", _recipe(tmp_path, model_dirs)]) == 1
    assert "ERROR   memory" in capsys.readouterr().out


def test_timing_a_step_moves_no_weight_and_leaves_no_gradient(tmp_path, model_dirs):
    import torch

    from distill.config import DistillConfig
    from distill.training.step import StepTimer
    from distill.training.trainer import Distiller

    config = DistillConfig.from_yaml(_recipe(tmp_path, model_dirs, lmbda=1.0, lmbda_schedule="constant"), {})
    distiller = Distiller(config, doctor=True)
    before = {name: value.clone() for name, value in distiller.student_model.state_dict().items()}
    timings = StepTimer(distiller.parts).time_step(0)
    assert timings["generated_micro_batches/student"] == 1 and timings["generation_student"] > 0
    assert timings["student"] > 0 and timings["teacher"] > 0 and timings["optimizer"] > 0
    after = distiller.student_model.state_dict()
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert all(p.grad is None for p in distiller.student_model.parameters())
    assert not (tmp_path / "run").exists()
