"""Guided-OPD in whole runs: the first step's gradient over conversations whose turns the teacher and the student
share is the same on one process with one micro-batch as on two processes with two each (the draw keyed by each row's
place in the step), and a run killed and resumed ends with the uninterrupted run's weights, its teacher turns
included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import train_tiny_tokenizer
from tests.distributed import check_split_invariance, first_step_gradient
from tests.helpers.training import kill_resume_and_compare, make_distiller
from tests.methods.test_multi_turn import ON_POLICY, PLUS, ROWS, scripted


def _guided_step_gradient(rank, world_size, tmp, batch, accumulation):
    import distill.teachers.local
    import distill.training.student_sampler

    torch.manual_seed(0)
    tokenizer = train_tiny_tokenizer()
    # each turn a function of the conversation so far only (not of a seed): what the split must not change is the draw;
    # the one-process run is in the test's own process, so the real functions are put back after it
    originals = distill.training.student_sampler.generate_completions, distill.teachers.local.generate_completions
    distill.training.student_sampler.generate_completions = scripted(tokenizer, "It is 5.", {"a": 2, "b": 3})[0]
    distill.teachers.local.generate_completions = scripted(tokenizer, "Five, says the teacher.", {"a": 4, "b": 1})[0]
    try:
        distiller = make_distiller(tokenizer, Path(tmp) / f"rank{rank}", rows=ROWS, **ON_POLICY, tools=[PLUS],
                                   guided_turns_probability=0.5, step_divergence_weighting=True, max_grad_norm=0.0,
                                   per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                                   max_new_tokens=200, max_prompt_length=300)
        return first_step_gradient(distiller)
    finally:
        distill.training.student_sampler.generate_completions, distill.teachers.local.generate_completions = originals


@pytest.mark.slow
def test_guided_conversations_give_a_split_invariant_gradient(tmp_path):
    single, _ = check_split_invariance(_guided_step_gradient, tmp_path,
                                       ("loss", "reverse_kl", "reverse_kl/turn_0", "reverse_kl/turn_1",
                                        "tools/teacher_turn_fraction", "step_divergence/weight"))
    assert 0.0 < single["metrics"]["tools/teacher_turn_fraction"] < 1.0  # both wrote turns


def _command(run_dir, model_dirs, data, *extra) -> list[str]:
    return [sys.executable, "-m", "tests.methods.guided_run", "train", "--method", "on_policy",
            "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]), "--dataset", str(data),
            "--output_dir", str(run_dir), "--environment", "tests.conversations.scripted_run:Ticker", "--max_turns", "4",
            "--max_steps", "6", "--save_steps", "1", "--logging_steps", "1", "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "2", "--max_new_tokens", "170", "--max_prompt_length", "340",
            "--eval_before_after", "false", "--progress_bar", "false", "--learning_rate", "1e-3",
            "--guided_turns_probability", "0.6", "--depth_curriculum_interval", "2", "--step_divergence_weighting",
            "true", *extra]


@pytest.mark.slow
def test_a_killed_guided_run_resumes_to_the_same_weights(tmp_path, model_dirs):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Tick the counter, question {i}."}],
                                        "start": 10 * i}) + "\n" for i in range(8)))
    straight, killed = kill_resume_and_compare(lambda run: _command(run, model_dirs, data), tmp_path, 3,
                                               module="tests.methods.guided_run")
    logged = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    fractions = [record["tools/teacher_turn_fraction"] for record in logged]
    assert fractions[0] > 0.0 and fractions[-1] < fractions[0]  # the teacher wrote turns, fewer as p decays
    resumed_log = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    for key in ("tools/teacher_turn_fraction", "tools/calls", "tools/max_turns", "loss"):
        assert [r[key] for r in resumed_log] == [r[key] for r in logged], key
