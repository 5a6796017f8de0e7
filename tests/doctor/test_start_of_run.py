"""The checks at the start of every `distill train`, and `distill doctor`: errors stop a run before it writes
anything, warnings are printed and kept in checks.json (strict_checks stops on them), doctor writes nothing, stops
(exit 1) on whatever would stop `distill train`, and lists every finding it can reach."""

from __future__ import annotations

import json
from collections import namedtuple

from distill.cli import main


def _recipe(tmp_path, model_dirs, rows: int = 6, **fields) -> str:
    """A recipe of `rows` plain-text rows for the tiny models; a field given as None is left out."""
    data = tmp_path / "text_prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Question {i}: what is {i} + {i}?", "completion": str(2 * i)}) + "\n"
                            for i in range(rows)))
    values = {"teacher": str(model_dirs["teacher"]), "student": str(model_dirs["student"]), "dataset": str(data),
              "method": "gkd", "learning_rate": 1e-5, "max_steps": 1, "max_new_tokens": 6, "per_device_train_batch_size": 2,
              "gradient_accumulation_steps": 1, "eval_before_after": False, "progress_bar": False, "save_steps": 0,
              "output_dir": str(tmp_path / "run"), **fields}
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("".join(f"{key}: {json.dumps(value)}\n" for key, value in values.items() if value is not None))
    return str(recipe)


def _text(out: str) -> str:
    """Doctor's report with its wrapping undone (one space between words)."""
    return " ".join(out.split())


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


def reward_that_fails(prompts, completions, rows) -> list[float]:
    """A reward function that raises on every completion (named by import path by the test below)."""
    raise KeyError("no grader for this row")


def test_a_timed_step_that_fails_as_training_would_stops_doctor_with_exit_1(tmp_path, model_dirs, capsys):
    recipe = _recipe(tmp_path, model_dirs, teacher=None, method="sdpo", num_generations=2, max_reprompt_length=96,
                     reward_funcs=["tests.doctor.test_start_of_run:reward_that_fails"])
    assert main(["doctor", recipe]) == 1  # was: a warning, and exit 0
    out = _text(capsys.readouterr().out)
    assert "ERROR step_time: step 0 failed as it would in `distill train`, which stops there: RewardFunctionError" in out
    assert "KeyError: 'no grader for this row'" in out and "1 error(s)" in out
    assert not (tmp_path / "run").exists()
    assert main(["train", recipe]) == 3  # what doctor said: training stops at that step
    assert "continue with `distill train --resume" in capsys.readouterr().err


def test_a_dataset_smaller_than_one_steps_prompts_still_gets_its_other_checks(tmp_path, model_dirs, capsys):
    recipe = _recipe(tmp_path, model_dirs, rows=1)
    assert main(["doctor", recipe]) == 1
    out = _text(capsys.readouterr().out)
    assert ("ERROR prompts_per_step: per_device_train_batch_size (2) x gradient_accumulation_steps (1) x processes (1) "
            "= 2 prompts per optimizer step, more than the dataset's 1") in out
    assert "WARNING plain_text_prompts: 1 of 1 dataset rows" in out  # the checks that read the models and rows ran
    assert "INFO pad_is_eos:" in out and "INFO memory: about" in out
    assert "INFO step_time: not run: it runs the run's steps, and the errors found (prompts_per_step)" in out
    assert "1 error(s), 1 warning(s), 3 note(s)" in out
    assert not (tmp_path / "run").exists()


def test_doctor_lists_independent_problems_together_where_training_stops_at_the_first(tmp_path, model_dirs, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    recipe = _recipe(tmp_path, model_dirs, rows=1, max_prompt_length=600)  # the tiny models' context is 512
    assert main(["doctor", recipe]) == 1
    out = _text(capsys.readouterr().out)
    assert f"ERROR output_dir: output_dir {run_dir} already exists and is not empty" in out
    assert "ERROR prompts_per_step: per_device_train_batch_size (2)" in out
    assert "ERROR context_length: max_prompt_length (600) + max_new_tokens (6) = 606 tokens, more than the student" in out
    assert "WARNING plain_text_prompts" in out and "INFO memory: about" in out
    assert "INFO step_time: not run: it runs the run's steps, and the errors found (context_length, output_dir, " \
           "prompts_per_step)" in out
    assert "3 error(s), 1 warning(s)" in out
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"] and (run_dir / "notes.txt").read_text() == "mine"
    assert main(["train", recipe]) == 2
    err = capsys.readouterr().err
    assert "output_dir" in err and "prompts per optimizer step" not in err  # training stops at the first, as before


def test_a_problem_that_stops_the_set_up_is_reported_with_those_found_before_it(tmp_path, model_dirs, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    assert main(["doctor", _recipe(tmp_path, model_dirs, student=str(tmp_path / "no_such_student"))]) == 1
    out = _text(capsys.readouterr().out)
    assert f"ERROR output_dir: output_dir {run_dir} already exists" in out
    assert "ERROR setup: student:" in out and "no_such_student" in out
    assert "INFO checks: not run: the set-up stopped at the error above" in out and "2 error(s)" in out
