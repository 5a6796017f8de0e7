"""Hostile tools and environments in whole runs: a tool that spins holding the GIL, exits, crashes, raises, returns
something huge or not text, or allocates without bound is a failed call of its true kind and the run trains on; an
environment whose worker dies mid-conversation stops the step with a checkpoint and the resume command; a
`tool_timeout` that cannot bound a call is refused before any model loads; `distill doctor` runs no tool unless told
to. Every wait is bounded (`pytest.mark.timeout`, subprocess timeouts): a run that hangs fails the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from distill import DistillConfig
from distill.conversations.calls import STAND_IN
from distill.errors import EnvironmentLost
from distill.generation.sample import Sample
from tests.conftest import tiny_lm
from tests.conversations.toolbox import MISBEHAVIOURS, tool_worker_pids
from tests.helpers.training import make_distiller

TOOLBOX = "tests.conversations.toolbox"
# Each way of failing, and the kind it is counted as (the last is a call that works).
HOW = {"spin": "timeout", "regex": "timeout", "os_exit": "exited", "sys_exit": "exited", "segfault": "crashed",
       "raise": "raised", "huge": "too_long", "hog": "out_of_memory", "dict": "not_text", "fine": None}


def scripted(tokenizer, calls: list[dict]):
    """Generation scripted: a turn with no tool result yet makes `calls`, a turn after the results answers."""
    eos = tokenizer.eos_token_id
    call = tokenizer("".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>\n" for c in calls).rstrip("\n"),
                     add_special_tokens=False)["input_ids"] + [eos]
    answer = tokenizer("Done.", add_special_tokens=False)["input_ids"] + [eos]

    def generate(model, prompts, sampling, *args, with_log_probs=False, **kwargs):
        out = []
        for prompt in prompts:
            ids = (answer if "<|im_start|>tool" in tokenizer.decode(prompt) else call)[: sampling.max_new_tokens]
            out.append(Sample(list(ids), False, [-0.5] * len(ids) if with_log_probs else None))
        return out

    return generate


def long_run(tokenizer, tmp_path, **fields):
    """An on_policy run of one step of 2 conversations between tiny models that hold 2,048 positions."""
    eos = tokenizer.eos_token_id
    rows = [{"prompt": [{"role": "user", "content": f"Try them all, {i}."}]} for i in range(4)]
    return make_distiller(tokenizer, tmp_path, rows=rows, method="on_policy", max_new_tokens=1400,
                          max_prompt_length=400, max_turns=2, per_device_train_batch_size=2,
                          gradient_accumulation_steps=1, max_steps=1, seq_kd=True, lmbda_schedule="step",
                          teacher=tiny_lm(len(tokenizer), layers=2, seed=1, eos_token_id=eos, positions=2048),
                          student=tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=eos, positions=2048), **fields)


def our_workers() -> list[int]:
    return [pid for pid, parent in tool_worker_pids().items() if parent == os.getpid()]


@pytest.mark.timeout(300)
def test_every_hostile_tool_is_a_failed_call_of_its_kind_and_the_run_trains_on(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    assert set(HOW) - {"fine"} == set(MISBEHAVIOURS)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions",
                        scripted(tokenizer, [{"name": "misbehave", "arguments": {"how": how}} for how in HOW]))
    run = long_run(tokenizer, tmp_path, tools=[f"{TOOLBOX}:misbehave"], tool_timeout=1.0, tool_memory_gb=1.0,
                   tool_workers=3)
    result = run.train()
    assert result["steps"] == 1
    (record,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert record["tools/calls"] == len(HOW) and record["tools/truncated"] == 0.0
    kinds = [kind for kind in HOW.values() if kind is not None]
    for kind in {*kinds, "unknown_tool", "bad_arguments", "malformed_call"}:
        assert record[f"tools/failed_{kind}"] == pytest.approx(kinds.count(kind) / len(HOW)), kind
    assert our_workers() == []  # the run's end closed its workers


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["crash", "stall"])
def test_an_environment_whose_worker_dies_stops_the_step_with_a_checkpoint_and_the_resume_command(
        tokenizer, tmp_path, monkeypatch, method):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions",
                        scripted(tokenizer, [{"name": "step", "arguments": {}}, {"name": method, "arguments": {}}]))
    run = long_run(tokenizer, tmp_path, environment=f"{TOOLBOX}:Fragile", tool_timeout=1.0, save_steps=1)
    with pytest.raises(EnvironmentLost) as raised:
        run.train()
    message = str(raised.value)
    assert f"Fragile.{method}" in message and "an instance's state cannot be rebuilt mid-conversation" in message
    assert "The run is checkpointed at step 0" in message and f"distill train --resume {tmp_path / 'run'}" in message
    assert (tmp_path / "run" / "checkpoints" / "step-000000" / "state.json").is_file()
    assert our_workers() == []


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 0.0, -1.0, 1e9])
def test_a_tool_timeout_that_cannot_bound_a_call_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match=r"tool_timeout must be a number of seconds above 0 and at most 86400"):
        DistillConfig(tools=[f"{TOOLBOX}:add"], tool_timeout=value).validate()
    with pytest.raises(ValueError, match="tool_workers must be >= 1, got 0"):
        DistillConfig(tools=[f"{TOOLBOX}:add"], tool_workers=0).validate()
    with pytest.raises(ValueError, match="tool_memory_gb must be a finite number >= 0"):
        DistillConfig(tools=[f"{TOOLBOX}:add"], tool_memory_gb=-1.0).validate()


def test_tool_timeout_inf_on_the_command_line_stops_before_anything_loads(capsys):
    from distill.cli import main

    assert main(["train", "--tools", f"{TOOLBOX}:add", "--tool_timeout", "inf"]) == 2
    assert "tool_timeout must be a number of seconds above 0" in capsys.readouterr().err


@pytest.mark.timeout(600)
def test_doctor_runs_no_tool_unless_told_to(tmp_path, model_dirs):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Mark it, {i}."}]}) + "\n"
                            for i in range(8)))
    marker = tmp_path / "marker"
    command = [sys.executable, "-m", "tests.conversations.scripted_run", "doctor", "--method", "on_policy",
               "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]), "--dataset", str(data),
               "--output_dir", str(tmp_path / "run"), "--tools", f"{TOOLBOX}:write_marker", "--max_turns", "2",
               "--max_steps", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
               "--max_new_tokens", "150", "--max_prompt_length", "300", "--eval_before_after", "false"]
    env = {**os.environ, "SCRIPTED_CALL": json.dumps({"name": "write_marker", "arguments": {"path": str(marker)}})}
    stood_in = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    said = " ".join(stood_in.stdout.split())  # the report wraps its lines
    assert "step_time" in said and "measured step 0" in said, stood_in.stdout + stood_in.stderr
    assert f"every call was answered {STAND_IN!r}" in said and "`distill doctor --run-tools` runs them" in said
    assert not marker.exists() and not (tmp_path / "run").exists()
    ran = subprocess.run([*command, "--run-tools"], capture_output=True, text=True, timeout=300, env=env)
    said = " ".join(ran.stdout.split())
    assert "measured step 0" in said and "every call was answered" not in said, ran.stdout + ran.stderr
    assert marker.read_text() == "a tool ran"
