"""A run with a stateful environment, killed and resumed, ends with the uninterrupted run's weights: each rollout
makes fresh environments from its rows (nothing of theirs is checkpointed), and the conversations are the same. The
environment lives in tool worker processes, which end with the killed run."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conversations.toolbox import orphaned_tool_workers
from tests.helpers.training import kill_resume_and_compare


def _command(run_dir, model_dirs, data, *extra) -> list[str]:
    return [sys.executable, "-m", "tests.conversations.scripted_run", "train", "--method", "on_policy",
            "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]), "--dataset", str(data),
            "--output_dir", str(run_dir), "--environment", "tests.conversations.scripted_run:Ticker", "--max_turns", "4",
            "--max_steps", "6", "--save_steps", "1", "--logging_steps", "1", "--per_device_train_batch_size", "2",
            "--gradient_accumulation_steps", "2", "--max_new_tokens", "170", "--max_prompt_length", "340",
            "--eval_before_after", "false", "--progress_bar", "false", "--learning_rate", "1e-3", *extra]


def not_orphaned() -> None:
    assert not orphaned_tool_workers(within=10.0)  # the killed run's workers ended with it


@pytest.mark.slow
def test_a_killed_run_with_a_stateful_environment_resumes_to_the_same_weights(tmp_path, model_dirs):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Tick the counter, question {i}."}],
                                        "start": 10 * i}) + "\n" for i in range(8)))
    straight, killed = kill_resume_and_compare(
        lambda run: _command(run, model_dirs, data), tmp_path, 3, module="tests.conversations.scripted_run",
        after_kill=not_orphaned)
    logged = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert all(record["tools/calls"] >= 1.0 and record["tools/failed_raised"] == 0.0 and record["tools/truncated"] == 0.0
               and record["tools/failed_timeout"] == 0.0 for record in logged)
    assert len({record["tools/calls"] for record in logged}) > 1  # the rows' seeds vary the conversations
    resumed_log = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["tools/calls"] for r in resumed_log] == [r["tools/calls"] for r in logged]
