"""A run with a stateful environment, killed and resumed, ends with the uninterrupted run's weights: each rollout
makes fresh environments from its rows (nothing of theirs is checkpointed), and the conversations are the same. The
environment lives in tool worker processes, which end with the killed run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conversations.toolbox import orphaned_tool_workers
from tests.helpers.training import kill_at_checkpoint


def _command(run_dir, model_dirs, data, *extra) -> list[str]:
    return [sys.executable, "-m", "tests.conversations.scripted_run", "train", "--method", "on_policy",
            "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]), "--dataset", str(data),
            "--output_dir", str(run_dir), "--environment", "tests.conversations.scripted_run:Ticker", "--max_turns", "4",
            "--max_steps", "6", "--save_steps", "1", "--logging_steps", "1", "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "2", "--max_new_tokens", "170", "--max_prompt_length", "340",
            "--eval_before_after", "false", "--progress_bar", "false", "--learning_rate", "1e-3", *extra]


@pytest.mark.slow
def test_a_killed_run_with_a_stateful_environment_resumes_to_the_same_weights(tmp_path, model_dirs):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Tick the counter, question {i}."}],
                                        "start": 10 * i}) + "\n" for i in range(8)))
    straight = tmp_path / "straight"
    done = subprocess.run(_command(straight, model_dirs, data), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    logged = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert all(record["tools/calls"] >= 1.0 and record["tools/failed_raised"] == 0.0 and record["tools/truncated"] == 0.0
               for record in logged)
    assert len({record["tools/calls"] for record in logged}) > 1  # the rows' seeds vary the conversations

    killed = tmp_path / "killed"
    kill_at_checkpoint(_command(killed, model_dirs, data), killed, 3)
    assert not orphaned_tool_workers(within=10.0)  # the killed run's workers ended with it
    resumed = subprocess.run([sys.executable, "-m", "tests.conversations.scripted_run", "train", "--resume", str(killed)],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = load_file(str(straight / "model" / "model.safetensors"))
    actual = load_file(str(killed / "model" / "model.safetensors"))
    assert expected.keys() == actual.keys()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)
    resumed_log = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["tools/calls"] for r in resumed_log] == [r["tools/calls"] for r in logged]
