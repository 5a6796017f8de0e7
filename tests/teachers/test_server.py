"""The server teacher against a real `distill serve-teacher` subprocess (tiny model, loopback)."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from distill.batch import Completion, collate
from distill.errors import TeacherServerError
from distill.losses import LogitHead
from distill.objectives import LossSettings, StudentTokens, divergence
from distill.signals import DenseSignal
from distill.teachers import LocalTeacher
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)
from distill.teachers.topk_client import ServerSettings, ServerTeacher
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, train_tiny_tokenizer
from tests.helpers.training import make_config
from tests.losses.reference import probs
from tests.teachers.servers import FaultProxy, serve_teacher


@pytest.fixture(scope="module")
def server(model_dirs):
    # --max-logprobs: the K = V test asks for all 320 tokens, over the default cap of 20.
    with serve_teacher(model_dirs["teacher"], "--max-logprobs", "320") as (url, _):
        yield url


@pytest.fixture(scope="module")
def local_teacher(model_dirs, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dirs["teacher"], dtype=torch.float32)
    return LocalTeacher(model, len(tokenizer), [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))


def _batch(tokenizer, n=3):
    rows = chat_rows(n)
    completions = []
    for i, row in enumerate(rows):
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["completion"] + " café 東京 🙂", add_special_tokens=False)["input_ids"][: 5 + 3 * i]
        ids = answer + [tokenizer.eos_token_id]
        holes = tuple(k % 4 != 2 for k in range(len(ids))) if i == 1 else None  # a trajectory's environment tokens
        completions.append(Completion(prompt, ids, "dataset", trained_mask=holes))
    return collate(completions, "dataset", tokenizer.pad_token_id)


def _teacher(url, k, **kwargs):
    settings = {"retries": 0, "timeout_s": 30.0, "backoff_s": 0.01, **kwargs}
    return ServerTeacher(ServerSettings(url, k, **settings), vocab_size=320)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_server_log_probs_are_the_teachers(server, local_teacher, tokenizer, temperature):
    batch = _batch(tokenizer)
    teacher = _teacher(server, 5)
    teacher.check(tokenizer)
    signal = teacher.score(batch, temperature)
    with torch.no_grad():
        hidden = backbone_hidden(local_teacher.model, batch.input_ids, batch.attention_mask)[:, :-1][predicting_positions(batch.completion_mask)]
    p = probs(local_teacher.head.full_logits(hidden), temperature)
    expected_top = p.topk(5, dim=1)
    targets = completion_targets(batch.input_ids, batch.completion_mask)
    assert signal.topk_ids.shape == (batch.num_completion_tokens, 5) and signal.topk_ids.dtype == torch.long
    assert torch.equal(signal.topk_ids, expected_top.indices)
    torch.testing.assert_close(signal.topk_log_probs.double(), expected_top.values.log(), atol=2e-5, rtol=0)
    torch.testing.assert_close(signal.sampled_log_probs.double(), p.gather(1, targets[:, None]).squeeze(1).log(), atol=2e-5, rtol=0)


def test_sparse_loss_at_k_equals_vocab_is_the_dense_loss(server, local_teacher, tokenizer, model_dirs):
    """With K = V the server's sparse signal carries the whole distribution: values and gradients match."""
    from transformers import AutoModelForCausalLM

    batch = _batch(tokenizer)
    student = AutoModelForCausalLM.from_pretrained(model_dirs["student"], dtype=torch.float32)
    positions = predicting_positions(batch.completion_mask)
    targets = completion_targets(batch.input_ids, batch.completion_mask)
    hidden = backbone_hidden(student, batch.input_ids, batch.attention_mask)[:, :-1][positions].detach()
    head = LogitHead(student.lm_head.weight.detach())
    settings = LossSettings(beta=0.5, temperature=1.0, chunk_size=8)
    dense_signal = local_teacher.score(batch, 1.0)
    sparse_signal = _teacher(server, len(tokenizer)).score(batch, 1.0)
    results = []
    for signal in (dense_signal, sparse_signal):
        h = hidden.clone().requires_grad_(True)
        out = divergence(StudentTokens(h, head, targets), signal, settings)
        out.loss_sum.backward()
        results.append((out.loss_sum.detach(), h.grad))
    assert isinstance(dense_signal, DenseSignal)
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-3, atol=1e-6)


def test_other_tokenizer_is_rejected_at_set_up(server):
    with pytest.raises(ValueError, match="tokenizer differs"):
        _teacher(server, 5).check(train_tiny_tokenizer(600))


def test_server_that_ignores_temperature_is_rejected(server, tokenizer):
    batch = _batch(tokenizer, 1)
    with FaultProxy(server, [], ignore_temperature=True) as proxy:
        with pytest.raises(ValueError, match="ignores prompt_logprobs_temperature"):
            _teacher(proxy.url, 5).check_temperature(2.0, batch.completions[0].prompt_ids)
    _teacher(server, 5).check_temperature(2.0, batch.completions[0].prompt_ids)  # the real server honours it


def test_transient_faults_are_retried_to_the_same_answer(server, tokenizer):
    batch = _batch(tokenizer)
    expected = _teacher(server, 4, request_size=8).score(batch, 1.0)
    with FaultProxy(server, ["garbage", "500", "slow", "drop"], delay=8.0) as proxy:
        got = _teacher(proxy.url, 4, retries=4, timeout_s=4.0, request_size=8).score(batch, 1.0)
    assert proxy.seen == ["garbage", "500", "slow", "drop", "ok"]
    assert torch.equal(got.topk_ids, expected.topk_ids) and torch.equal(got.topk_log_probs, expected.topk_log_probs)


@pytest.mark.parametrize("fault, message", [("short", "prompt_logprobs has"), ("bad_id", "outside the vocabulary"),
                                            ("garbage", "malformed response"), ("slow", "timed out|TimeoutError")])
def test_persistent_faults_end_in_a_clear_error(server, tokenizer, fault, message):
    timeout = 0.5 if fault == "slow" else 20.0
    with FaultProxy(server, [fault] * 3, delay=2.0) as proxy:
        with pytest.raises(TeacherServerError, match=message):
            _teacher(proxy.url, 4, retries=2, timeout_s=timeout, request_size=8).score(_batch(tokenizer), 1.0)
    assert proxy.seen == [fault] * 3


def test_connection_closed_while_idle_is_reopened_without_using_a_retry(server, tokenizer):
    """uvicorn closes idle kept-alive connections after 5 s, shorter than a training step."""
    import time

    teacher = _teacher(server, 4, retries=0, concurrency=1)
    first = teacher.score(_batch(tokenizer), 1.0)
    time.sleep(6)
    assert torch.equal(teacher.score(_batch(tokenizer), 1.0).topk_ids, first.topk_ids)


@pytest.mark.parametrize("value", [float("-inf"), float("nan"), 0.5])
def test_non_finite_or_positive_log_probs_are_malformed(value):
    from distill.teachers.topk_client import MalformedResponse, parse_prompt_logprobs

    body = {"choices": [{"index": 0, "prompt_logprobs": [None, {"5": {"logprob": -0.1}, "7": {"logprob": value}}]}]}
    with pytest.raises(MalformedResponse, match="finite number <= 0"):
        parse_prompt_logprobs(body, [[3, 5]], [1], 2, vocab_size=10)
    body["choices"][0]["prompt_logprobs"][1]["7"]["logprob"] = -3.0
    assert parse_prompt_logprobs(body, [[3, 5]], [1], 2, vocab_size=10)[0].ids.tolist() == [[5, 7]]


def test_bad_request_is_not_retried(server):
    teacher = _teacher(server, 4, retries=3)
    with pytest.raises(TeacherServerError, match="refused.*400.*max_tokens"):
        teacher.client.request("POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "prompt_logprobs": 2})


def test_prompt_logprobs_over_the_cap_are_refused_naming_the_option(server):
    teacher = _teacher(server, 4, retries=3)
    with pytest.raises(TeacherServerError, match="refused.*400.*greater than max allowed: 320.*--max-logprobs"):
        teacher.client.request("POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1, "prompt_logprobs": 321})


def test_cli_limits_reach_the_server(monkeypatch):
    import distill.commands.serve_teacher
    from distill.cli import main
    from distill.serving.limits import ServerLimits

    calls = []
    monkeypatch.setattr(distill.commands.serve_teacher, "serve", lambda *args: calls.append(args))
    assert main(["serve-teacher", "m", "--max-logprobs", "50", "--max-request-bytes", "1000", "--max-prompt-tokens", "99"]) == 0
    assert main(["serve-teacher", "m"]) == 0
    assert calls[0][-1] == ServerLimits(50, 1000, 99)
    assert calls[1][-1] == ServerLimits(20, 4 << 20, 65536)  # vLLM's --max-logprobs default; 4 MiB; 64k tokens
    assert main(["serve-teacher", "m", "--max-logprobs", "0"]) == 2 and len(calls) == 2  # refused before loading


def _server_config(tmp_path, url, **overrides):
    return make_config(tmp_path, method="gkd", teacher_url=url, student=None, teacher_logprobs=8, teacher_concurrency=1,
                       teacher_retries=1, teacher_timeout=5.0, lmbda=0.5, **overrides)


def test_train_against_the_server(server, tokenizer, model_dirs, tmp_path):
    """A whole run with the teacher behind the server, evaluation included (on the student's own samples)."""
    config = _server_config(tmp_path, server, max_steps=3, eval_before_after=True, eval_max_new_tokens=6, eval_max_prompts=4)
    config.student = str(model_dirs["student"])
    distiller = Distiller(config, train_dataset=datasets.Dataset.from_list(chat_rows(16)),
                          eval_dataset=datasets.Dataset.from_list(chat_rows(4, seed=5)))
    before = {k: v.clone() for k, v in distiller.student_model.state_dict().items()}
    result = distiller.train()
    after = distiller.parts.with_student.current().state_dict()
    assert result["steps"] == 3 and result["train"]["loss"] > 0
    assert not all(torch.equal(before[k], after[k]) for k in before)
    assert set(result["eval"]["after"]) == {"on_student_completions", "repetition", "sampled_repetition"}  # a server teacher does not sample
    assert "teacher" not in json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())  # nor answers greedily
    assert result["eval"]["after"]["on_student_completions"]["tokens"] > 0
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert f"teacher server {server}" in card
    assert distiller.teacher.pool._shutdown  # training closed the teacher's connection pool

    # `distill eval RUN_DIR` of a server run scores through the run's server (no teacher model is loaded).

    from distill.cli import main

    data = tmp_path / "eval.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in chat_rows(3, seed=9)))
    assert main(["eval", str(tmp_path / "run"), "--dataset", str(data), "--split", "train", "--max-new-tokens", "4",
                 "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "run" / "eval-cli" / "eval.json").read_text())
    assert set(report["metrics"]["student"]) == {"on_student_completions", "repetition", "sampled_repetition"}


def test_server_killed_mid_run_checkpoints_and_resumes_identically(server, tokenizer, model_dirs, tmp_path):
    """The server dies after step 2: the run stops with a clear error and a checkpoint of step 2, which
    resumes (against a new server) to exactly the weights of an uninterrupted run."""
    from distill.rundir.directory import resume_config

    rows = datasets.Dataset.from_list(chat_rows(16))
    config = _server_config(tmp_path / "full", server, max_steps=4, save_steps=1)
    config.student = str(model_dirs["student"])
    full = Distiller(config, train_dataset=rows)
    full.train()
    reference = {k: v.clone() for k, v in full.parts.with_student.current().state_dict().items()}

    with serve_teacher(model_dirs["teacher"]) as (url, process):
        config = _server_config(tmp_path / "cut", url, max_steps=4, save_steps=1)
        config.student = str(model_dirs["student"])
        cut = Distiller(config, train_dataset=rows)
        original_step = cut.train_step

        def step_then_kill(step, *args, **kwargs):
            if step == 2:
                process.kill()
                process.wait()
            return original_step(step, *args, **kwargs)

        cut.train_step = step_then_kill
        with pytest.raises(TeacherServerError, match="checkpointed at step 2"):
            cut.train()
    from transformers import AutoModelForCausalLM

    from distill.rundir.checkpoint import checkpoint_dir, latest_checkpoint

    run_dir = tmp_path / "cut" / "run"
    assert latest_checkpoint(run_dir) == checkpoint_dir(run_dir, 2)
    AutoModelForCausalLM.from_pretrained(checkpoint_dir(run_dir, 2) / "student")  # intact and loadable

    with serve_teacher(model_dirs["teacher"]) as (url, _):
        resumed = Distiller(resume_config(run_dir, {"teacher_url": url}), train_dataset=rows, resume=True)
        assert resumed.train()["steps"] == 4
    weights = resumed.parts.with_student.current().state_dict()
    assert all(torch.equal(reference[k], weights[k]) for k in reference)
