"""Asynchronous rollouts (`max_staleness`, `distill.training.async_rollout`): s = 0 is the synchronous loop, s = 1 samples each
step from the weights of the step before and is reproducible, split invariant and resumable; a failing producer
fails the step as a teacher server does, and nothing is lost."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from distill import DistillConfig
from distill.generation import register_engine, unregister_engine
from distill.rundir.metrics_log import read_metrics
from distill.training.async_rollout import RolloutProducerError
from distill.training.step import StepTimer
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm, train_tiny_tokenizer
from tests.distributed import capture_at_optimizer_step, check_split_invariance
from tests.generation.test_engines import ArgmaxLoop
from tests.helpers.training import kill_resume_and_compare, make_config, make_distiller
from tests.methods.test_iw_opd import IW_OPD
from tests.training.test_resume import _train_command

ON_POLICY = dict(lmbda=1.0, max_new_tokens=10, max_steps=4)


def _weights(distiller) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in distiller.student_model.named_parameters()}


def _timeless(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if not k.startswith(("time/", "tokens_per_second/"))} for record in records]


def test_max_staleness_0_is_the_synchronous_loop(tokenizer, tmp_path):
    runs = []
    for name, extra in (("default", {}), ("zero", {"max_staleness": 0})):
        distiller = make_distiller(tokenizer, tmp_path / name, **ON_POLICY, **extra)
        distiller.train()
        runs.append((_weights(distiller), read_metrics(distiller.parts.run_dir / "metrics.jsonl")))
    assert runs[0][0].keys() == runs[1][0].keys()
    for name in runs[0][0]:
        assert torch.equal(runs[0][0][name], runs[1][0][name]), name
    assert _timeless(runs[0][1]) == _timeless(runs[1][1])
    assert not any(key.startswith(("staleness", "time/")) for key in runs[1][1][-1])  # nothing new is logged at 0


def test_max_staleness_1_samples_each_step_from_the_weights_before_and_is_reproducible(tokenizer, tmp_path):
    runs = []
    for name in ("first", "second"):
        distiller = make_distiller(tokenizer, tmp_path / name, **ON_POLICY, max_staleness=1)
        distiller.train()
        runs.append((_weights(distiller), read_metrics(distiller.parts.run_dir / "metrics.jsonl")))
    for name in runs[0][0]:
        assert torch.equal(runs[0][0][name], runs[1][0][name]), name
    records = runs[0][1]
    assert _timeless(records) == _timeless(runs[1][1])
    assert [r["staleness"] for r in records] == [0.0, 1.0, 1.0, 1.0]  # step 0 samples from version 0, then one behind
    assert all(r["staleness/ratio_min"] <= r["staleness/ratio"] <= r["staleness/ratio_max"] for r in records[1:])
    assert records[1]["staleness/ratio_max"] != 1.0  # the policy moved: the ratio is not 1
    for timer in ("time/queue_wait", "time/generation", "time/training", "time/weight_push"):
        assert records[-1][timer] >= 0.0, timer
    # and it is not the synchronous run: the samples of step 1 are the weights of step 0's
    sync = make_distiller(tokenizer, tmp_path / "sync", **ON_POLICY)
    sync.train()
    assert any(not torch.equal(p, runs[0][0][n]) for n, p in _weights(sync).items())


def test_at_learning_rate_0_the_recorded_and_recomputed_log_probs_agree(tokenizer, tmp_path):
    # Nothing moves, so pi_theta / pi_behaviour is 1 up to the numerics of sampling and training forwards.
    distiller = make_distiller(tokenizer, tmp_path / "run", **ON_POLICY, max_staleness=2, learning_rate=1e-12)
    distiller.train()
    for record in read_metrics(distiller.parts.run_dir / "metrics.jsonl")[2:]:
        assert record["staleness"] == 2.0
        assert record["staleness/ratio_max"] == pytest.approx(1.0, abs=1e-4)
        assert record["staleness/ratio_min"] == pytest.approx(1.0, abs=1e-4)


def test_iw_opd_takes_its_ppo_ratio_on_stale_samples(tokenizer, tmp_path):
    config = DistillConfig(**{**IW_OPD, "output_dir": str(tmp_path / "run"), "max_new_tokens": 10, "max_steps": 3,
                              "max_staleness": 1})
    distiller = Distiller(config, student=tiny_lm(len(tokenizer), seed=2, eos_token_id=tokenizer.eos_token_id),
                          teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id),
                          tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)))
    distiller.train()
    records = read_metrics(distiller.parts.run_dir / "metrics.jsonl")
    assert records[0]["iw_opd/ratio"] == 1.0  # fresh: rho = 1 by definition
    assert records[2]["iw_opd/ratio"] != 1.0 and records[2]["staleness"] == 1.0


def _stale_step_gradient(rank, world_size, tmp, batch, accumulation):
    """The gradient of optimizer step 1, whose samples come from the weights of step 0 (max_staleness 1)."""
    from pathlib import Path

    torch.manual_seed(0)
    tokenizer = train_tiny_tokenizer()
    distiller = make_distiller(tokenizer, Path(tmp) / f"rank{rank}", rows=chat_rows(8), lmbda=1.0, max_grad_norm=0.0,
                               per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                               max_new_tokens=12, max_staleness=1, max_steps=2)
    distiller.setup()
    try:
        distiller.train_step(0, distiller._new_window(), {}, log_step=True)
        captured = {}
        capture_at_optimizer_step(distiller, lambda: captured.update(
            {n: p.grad.detach().clone() for n, p in distiller.student_model.named_parameters()}))
        window = distiller._new_window()
        distiller.train_step(1, window, {}, log_step=True)
    finally:
        distiller.rollout.close()
    return {"grads": captured, "metrics": window.reduce()}


@pytest.mark.slow
def test_a_stale_step_is_split_invariant_across_processes_and_micro_batches(tmp_path):
    single, ranks = check_split_invariance(_stale_step_gradient, tmp_path, ("loss", "staleness", "staleness/ratio",
                                                                            "completion_length", "grad_norm"))
    assert single["metrics"]["staleness"] == 1.0


@pytest.mark.slow
def test_a_run_killed_and_resumed_at_max_staleness_1_matches_an_uninterrupted_one(tmp_path, model_dirs):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    def command(run_dir):
        return _train_command(run_dir, model_dirs, data, "--max_staleness", "1")

    straight, killed = kill_resume_and_compare(command, tmp_path, 3)
    assert _timeless(read_metrics(killed / "metrics.jsonl")) == _timeless(read_metrics(straight / "metrics.jsonl"))


class FailingArgmaxLoop(ArgmaxLoop):
    """A toy engine that fails its `fail_at`-th decode (a server that died), then works again (it came back)."""

    name = "toy_failing"

    def __init__(self, fail_at: int):
        super().__init__()
        self.fail_at = fail_at

    def decode(self, model, request):
        if self.calls + 1 == self.fail_at:
            self.calls += 1
            self.fail_at = 0
            raise ConnectionError("the generation server went away")
        return super().decode(model, request)


@pytest.fixture
def failing_engine():
    engine = register_engine(FailingArgmaxLoop(fail_at=3))
    yield engine
    unregister_engine(engine.name)


def test_a_failing_producer_fails_the_step_checkpoints_before_it_and_resumes_to_the_same_weights(tokenizer, tmp_path,
                                                                                                   failing_engine):
    settings = dict(ON_POLICY, max_steps=6, max_staleness=2, generation_engine="toy_failing", save_steps=0)
    straight = make_distiller(tokenizer, tmp_path / "straight", **settings)
    failing_engine.fail_at = 0  # an engine that never fails
    straight.train()
    failing_engine.calls, failing_engine.fail_at = 0, 3  # the third rollout (step 2) fails

    failed = make_distiller(tokenizer, tmp_path / "failed", **settings)
    with pytest.raises(RolloutProducerError, match=r"(?s)sampling step 2.*went away.*checkpointed at step 2.*--resume"):
        failed.train()
    run_dir = failed.parts.run_dir
    assert (run_dir / "checkpoints" / "step-000002").is_dir()
    assert not (run_dir / "model").exists()
    resumed = Distiller(make_config(tmp_path / "failed", **settings), student=tiny_lm(len(tokenizer), seed=2,
                                                                                      eos_token_id=tokenizer.eos_token_id),
                        teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id),
                        tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)), resume=True)
    resumed.train()
    for name, value in _weights(straight).items():
        assert torch.equal(value, _weights(resumed)[name]), name
    assert _timeless(read_metrics(run_dir / "metrics.jsonl")) == _timeless(read_metrics(straight.parts.run_dir / "metrics.jsonl"))


@pytest.mark.parametrize("overrides, message", [
    (dict(max_staleness=-1), "max_staleness must be an integer >= 0"),
    (dict(max_staleness=1, lmbda=0.0), "never samples from the student"),
    (dict(max_staleness=1, staleness_correction="clip"), "staleness_correction must be one of"),
    (dict(max_staleness=1, staleness_ratio_cap=1.0), "staleness_ratio_cap must be a finite number > 1"),
    (dict(max_staleness=1, sampling_temperature=0.7), "sampling_temperature .* must be equal .* max_staleness > 0"),
    (dict(staleness_ratio="token"), "staleness_ratio is only read with max_staleness > 0"),
])
def test_bad_asynchronous_settings_fail_before_any_model_loads(tmp_path, overrides, message):
    from tests.helpers.training import FAST

    with pytest.raises(ValueError, match=message):
        DistillConfig(**{**FAST, "output_dir": str(tmp_path / "run"), **overrides}).validate()


def test_pacing_drop_discards_rollouts_staler_than_the_bound_and_samples_them_again(tokenizer, tmp_path):
    distiller = make_distiller(tokenizer, tmp_path / "run", **{**ON_POLICY, "max_steps": 6}, max_staleness=1,
                               staleness_pacing="drop")
    publish = distiller.rollout.after_optimizer_step

    def slow_training(step):  # the worker samples two steps ahead from the old weights before the new ones come
        import time

        time.sleep(0.5)
        publish(step)

    distiller.rollout.after_optimizer_step = slow_training
    distiller.train()
    records = read_metrics(distiller.parts.run_dir / "metrics.jsonl")
    assert distiller.rollout.dropped >= 1
    assert sum(r["staleness/dropped"] for r in records) == distiller.rollout.dropped
    assert all(r["staleness_max"] <= 1 for r in records)  # the bound holds whatever the timing


def test_pacing_wait_never_drops(tokenizer, tmp_path):
    distiller = make_distiller(tokenizer, tmp_path / "run", **ON_POLICY, max_staleness=2)
    distiller.train()
    assert distiller.rollout.dropped == 0
    assert all(r["staleness/dropped"] == 0 for r in read_metrics(distiller.parts.run_dir / "metrics.jsonl"))


def test_doctor_times_a_step_of_an_asynchronous_run_without_its_worker(tokenizer, tmp_path):
    distiller = make_distiller(tokenizer, tmp_path / "run", **ON_POLICY, max_staleness=1)
    before = _weights(distiller)
    timings = StepTimer(distiller.parts).time_step(1)  # no worker yet: the step samples in place
    assert timings["generation_student"] > 0 and timings["optimizer"] >= 0
    for name, value in _weights(distiller).items():
        assert torch.equal(value, before[name]), name
