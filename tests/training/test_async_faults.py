"""The asynchronous producer fails loudly: anything that ends its worker (exceptions outside `Exception` included) stops
the run as a step failure with its checkpoint and resume command, in bounded time; `max_staleness` is bounded by
`max_steps` before any model loads; the producer holds no more weight snapshots than its pacing's bound."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

from distill import DistillConfig
from distill.methods.async_fields import AsyncFields
from distill.training.async_rollout import RolloutProducerError
from distill.training.trainer import Distiller
from tests.conftest import chat_rows
from tests.helpers.training import FAST, forbid_model_loading, make_distiller

ON_POLICY = dict(lmbda=1.0, max_new_tokens=10, max_steps=4)
ENVIRONMENTS = "tests.training.exiting_environments"


@pytest.mark.parametrize("environment, raised", [
    # reset calls sys.exit(3): in its tool worker process, which reports it (no longer the producer thread's exit)
    ("ExitsOnReset", "ValueError: environment: tests.training.exiting_environments:ExitsOnReset.reset exited before "
                     "returning a result (sys.exit(3))"),
    # an async get_reward whose task is cancelled (a BaseException), reported by its worker as a reward's failure
    ("CancelledReward", "RewardFunctionError: environment: tests.training.exiting_environments:CancelledReward."
                        "get_reward raised CancelledError"),
])
def test_an_environment_ending_the_worker_stops_the_run_with_the_resume_command(tmp_path, model_dirs, environment,
                                                                                raised):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(8)))
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "distill", "train", "--teacher", str(model_dirs["teacher"]), "--student",
               str(model_dirs["student"]), "--dataset", str(data), "--output_dir", str(run_dir), "--method", "on_policy",
               "--max_staleness", "1", "--environment", f"{ENVIRONMENTS}:{environment}", "--max_steps", "3",
               "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--max_new_tokens", "6",
               "--eval_before_after", "false", "--progress_bar", "false", "--save_steps", "0"]
    # Before, the worker thread ended silently and the training thread waited for its rollout forever.
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung waiting for a rollout from a dead worker")
    assert done.returncode == 3, done.stderr[-3000:]  # a step failure, as a teacher server's
    assert f"the rollout producer failed sampling step 0's rollout: {raised}" in done.stderr, done.stderr[-2000:]
    assert f"continue with `distill train --resume {run_dir}`" in done.stderr
    assert (run_dir / "checkpoints" / "step-000000").is_dir() and not (run_dir / "model").exists()


def test_a_worker_that_dies_between_rollouts_fails_the_step_waiting_for_it(tokenizer, tmp_path):
    """Ended outside a rollout (here: while choosing the weights to sample from), the worker leaves no result: the
    training thread waiting for one learns it has ended (bounded: the training runs in a thread joined with a timeout)."""
    distiller = make_distiller(tokenizer, tmp_path, **ON_POLICY, max_staleness=1)

    def exit_in_the_worker(step):
        raise SystemExit(7)

    distiller.rollout._sampling_version = exit_in_the_worker
    failure: list[BaseException] = []

    def train():
        try:
            distiller.train()
        except BaseException as error:  # noqa: BLE001  (kept for the assertions below)
            failure.append(error)

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the training thread waits forever for a dead worker"
    [error] = failure
    assert isinstance(error, RolloutProducerError)
    assert "worker ended before sampling step 0's rollout: SystemExit: 7" in str(error) and "--resume" in str(error)
    assert (distiller.parts.run_dir / "checkpoints" / "step-000000").is_dir()


def test_an_absurd_max_staleness_is_refused_before_any_model_loads(tmp_path, monkeypatch):
    forbid_model_loading(monkeypatch, resolving=True)
    config = DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "lmbda": 1.0, "max_staleness": 10**10})
    with pytest.raises(ValueError, match=r"max_staleness 10000000000 is not below max_steps 2: .*set max_staleness "
                                         r"below max_steps"):
        Distiller(config)
    with pytest.raises(ValueError, match="max_staleness 2 is not below max_steps 2"):
        DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "lmbda": 1.0, "max_staleness": 2}).validate()
    DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), "lmbda": 1.0, "max_staleness": 1}).validate()


class CountingVersions(dict):
    """The producer's published weight versions, counting the most held at once."""

    most = 0

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.most = max(self.most, len(self))

    def setdefault(self, key, value=None):
        value = super().setdefault(key, value)
        self.most = max(self.most, len(self))
        return value


@pytest.mark.parametrize("pacing, max_staleness, max_steps", [("wait", 2, 6), ("wait", 1, 5), ("drop", 1, 5)])
def test_the_producer_holds_no_more_snapshots_than_its_pacing_bound(tokenizer, tmp_path, pacing, max_staleness,
                                                                    max_steps):
    """A slow worker is the worst case: the trainer publishes every version the bound allows before the worker moves
    on. The bound (`AsyncFields.snapshots_held`) is what the doctor's memory estimate counts."""
    distiller = make_distiller(tokenizer, tmp_path, **{**ON_POLICY, "max_steps": max_steps}, max_staleness=max_staleness,
                               staleness_pacing=pacing)
    rollout = distiller.rollout
    rollout._versions = versions = CountingVersions()
    sample = rollout._sample

    def slow_sample(step, version, snapshot):
        import time

        time.sleep(0.3)
        return sample(step, version, snapshot)

    rollout._sample = slow_sample
    distiller.train()
    bound = AsyncFields.of(distiller.parts.config).snapshots_held(max_steps)
    assert 1 <= versions.most <= bound, (versions.most, bound)
