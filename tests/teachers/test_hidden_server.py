"""The hidden-state payload over the wire: `distill serve-teacher` sends the teacher's final hidden states, the
trainer applies the teacher's head (`teacher_payload: hidden`). The loss and its gradient must be the local
teacher's; every answer that does not fit what was asked is refused with the reason."""

from __future__ import annotations

import json
import sys

import datasets
import pytest
import torch

from distill.batch import Completion, all_trained, collate, skipping_first, untrained
from distill.errors import TeacherServerError
from distill.losses import LogitHead
from distill.objectives import LossSettings, StudentTokens, divergence
from distill.serving.app import build_app
from distill.serving.scoring import ScoringEngine
from distill.signals import DenseSignal, RoutedSignal
from distill.teachers import LocalTeacher
from distill.teachers.head import head_fingerprint
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)
from distill.teachers.hidden_client import HiddenStateServerTeacher
from distill.teachers.hidden_payload import decode_hidden, encode_hidden
from distill.teachers.routed import RoutedTeacher
from distill.teachers.topk_client import ServerSettings
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import kill_at_checkpoint, make_config
from tests.teachers.servers import post, serve_app


def _load(directory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(directory)


@pytest.fixture(scope="module")
def second_teacher_dir(tmp_path_factory, tokenizer):
    """Another teacher of the same tokenizer (other weights): the second route, and a head that does not match."""
    directory = tmp_path_factory.mktemp("teacher-b")
    tiny_lm(len(tokenizer), layers=3, seed=7, eos_token_id=tokenizer.eos_token_id).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def servers(model_dirs, second_teacher_dir):
    """Two in-process `serve-teacher` apps: "a" serves the test teacher, "b" the second one."""
    import contextlib

    with contextlib.ExitStack() as stack:
        urls = {}
        for name, directory in (("a", model_dirs["teacher"]), ("b", second_teacher_dir)):
            model, tok = _load(directory)
            urls[name] = stack.enter_context(serve_app(build_app(ScoringEngine(model, tok, torch.device("cpu")), name,
                                                                 max_batch_tokens=64)))
        yield urls


def _client(url, tokenizer, head_path=None, dtype="float32", request_size=2):
    teacher = HiddenStateServerTeacher(ServerSettings(url, 20, None, concurrency=2, request_size=request_size, timeout_s=30.0,
                                                      retries=0, backoff_s=0.01), len(tokenizer), dtype)
    teacher.check(tokenizer, None if head_path is None else str(head_path))
    return teacher


def _batch(tokenizer, n=4, teacher_ids=None):
    """Rows of unequal lengths, one whose first two tokens get no loss, one with none trained (masked positions)."""
    from distill.data import Example

    completions = []
    for i, row in enumerate(chat_rows(n)):
        text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["completion"] + " café 東京 🙂", add_special_tokens=False)["input_ids"][: 4 + 3 * i]
        example = Example(index=i, prompt=row["prompt"], completion=None, teacher_id=teacher_ids[i] if teacher_ids else "")
        ids = answer + [tokenizer.eos_token_id]
        completions.append(Completion(prompt, ids, "dataset", example=example, trained_mask=row_mask(i, len(ids))))
    return collate(completions, "dataset", tokenizer.pad_token_id)


def row_mask(i: int, length: int) -> tuple[bool, ...]:
    """Row 1 skips 2 tokens, row 2 is untrained, row 3 has holes (a trajectory's environment tokens), others whole."""
    if i == 3:
        return tuple(k % 3 != 1 for k in range(length))
    return skipping_first(length, 2) if i == 1 else untrained(length) if i == 2 else all_trained(length)


def _loss_and_grad(student, batch, signal, beta, temperature):
    positions = predicting_positions(batch.completion_mask)
    hidden = backbone_hidden(student, batch.input_ids, batch.attention_mask)[:, :-1][positions].detach().requires_grad_(True)
    tokens = StudentTokens(hidden, LogitHead(student.lm_head.weight.detach()), completion_targets(batch.input_ids, batch.completion_mask))
    out = divergence(tokens, signal, LossSettings(beta=beta, temperature=temperature, chunk_size=8))
    out.loss_sum.backward()
    return out.loss_sum.detach().double(), hidden.grad.double()


def _local(directory, tokenizer):
    model, _ = _load(directory)
    return LocalTeacher(model, len(tokenizer), [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_loss_and_its_gradient_are_the_local_teachers(servers, model_dirs, tokenizer, beta, temperature):
    batch = _batch(tokenizer)
    assert 0 < batch.num_completion_tokens < sum(len(c.completion_ids) for c in batch.completions)  # masked positions
    student, _ = _load(model_dirs["student"])
    remote = _client(servers["a"], tokenizer).score(batch, temperature)
    local = _local(model_dirs["teacher"], tokenizer).score(batch, temperature)
    assert isinstance(remote, DenseSignal) and remote.hidden.shape == local.hidden.shape
    remote_loss, remote_grad = _loss_and_grad(student, batch, remote, beta, temperature)
    local_loss, local_grad = _loss_and_grad(student, batch, local, beta, temperature)
    assert local_loss > 0
    assert _relative(remote_loss, local_loss) < 1e-6 and _relative(remote_grad, local_grad) < 1e-6


def test_two_teachers_routed_by_teacher_id_each_with_its_own_head(servers, model_dirs, second_teacher_dir, tokenizer):
    ids = ["a", "b", "b", "a"]
    batch = _batch(tokenizer, teacher_ids=ids)
    student, _ = _load(model_dirs["student"])
    remote = RoutedTeacher({tid: _client(servers[tid], tokenizer) for tid in "ab"}, tokenizer.pad_token_id).score(batch, 1.0)
    local = RoutedTeacher({"a": _local(model_dirs["teacher"], tokenizer), "b": _local(second_teacher_dir, tokenizer)},
                          tokenizer.pad_token_id).score(batch, 1.0)
    assert isinstance(remote, RoutedSignal) and {tid for tid, _, _ in remote.parts} == {"a", "b"}
    heads = {tid: head_fingerprint(part.head) for tid, _, part in remote.parts}
    assert heads["a"] != heads["b"]
    for beta in (0.0, 1.0):
        remote_loss, remote_grad = _loss_and_grad(student, batch, remote, beta, 1.0)
        local_loss, local_grad = _loss_and_grad(student, batch, local, beta, 1.0)
        assert _relative(remote_loss, local_loss) < 1e-6 and _relative(remote_grad, local_grad) < 1e-6


def test_bfloat16_on_the_wire_is_the_float32_states_rounded(servers, tokenizer):
    batch = _batch(tokenizer)
    exact = _client(servers["a"], tokenizer).score(batch, 1.0).hidden
    rounded = _client(servers["a"], tokenizer, dtype="bfloat16").score(batch, 1.0).hidden
    assert torch.equal(rounded, exact.to(torch.bfloat16).float()) and not torch.equal(rounded, exact)


def test_the_head_read_from_the_teachers_files_is_the_one_the_server_sends(servers, model_dirs, tokenizer):
    from_server = _client(servers["a"], tokenizer).head
    from_files = _client(servers["a"], tokenizer, head_path=model_dirs["teacher"]).head
    assert torch.equal(from_files.weight, from_server.weight) and head_fingerprint(from_files) == head_fingerprint(from_server)


def test_a_head_of_another_model_or_shape_is_refused_at_set_up(servers, second_teacher_dir, tmp_path, tokenizer):
    with pytest.raises(ValueError, match="does not match the server's model"):
        _client(servers["a"], tokenizer, head_path=second_teacher_dir)
    wider = tmp_path / "wider"
    tiny_lm(len(tokenizer), layers=1, seed=3, hidden=48, eos_token_id=tokenizer.eos_token_id).save_pretrained(wider)
    with pytest.raises(ValueError, match=r"is \(320, 48\), the server's teacher is \(320, 32\)"):
        _client(servers["a"], tokenizer, head_path=wider)
    with pytest.raises(ValueError, match="no config.json"):
        _client(servers["a"], tokenizer, head_path=tmp_path)


def _only_prompt_logprobs(app):
    """The app with its hidden-state endpoints gone: a server that answers only vLLM's protocol."""
    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/distill/"):
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"detail": "Not Found"}'})
            return
        await app(scope, receive, send)
    return wrapped


def test_a_server_answering_only_prompt_logprobs_is_refused_naming_the_fix(model_dirs, tokenizer):
    model, tok = _load(model_dirs["teacher"])
    with serve_app(_only_prompt_logprobs(build_app(ScoringEngine(model, tok, torch.device("cpu")), "plain"))) as url:
        with pytest.raises(ValueError, match="answers only vLLM's prompt_logprobs.*teacher_payload: topk"):
            _client(url, tokenizer)


def test_requests_the_server_cannot_answer_are_400s_with_the_reason(servers):
    url = servers["a"]
    for body, message in (({"prompts": [[1, 2, 3]], "starts": [0]}, "starts\\[0\\] must be an integer in \\[1, 3\\]"),
                          ({"prompts": [[1, 2, 3]], "starts": [1, 2]}, "starts must be a list of 1 integers"),
                          ({"prompts": [[1, 999]], "starts": [1]}, "token ids in \\[0, 320\\)"),
                          ({"prompts": [[1, 2]], "starts": [1], "dtype": "int8"}, "dtype must be one of"),
                          ({"prompts": [[1, 2]], "starts": [1], "model": "zzz"}, "is not served here")):
        status, answer = post(url, "/distill/v1/hidden_states", body)
        assert status == 400, body
        import re

        assert re.search(message, answer["error"]["message"]), answer


def test_a_payload_of_the_wrong_count_width_head_or_values_is_refused():
    hidden, sha = torch.randn(5, 4), "f" * 64
    good = encode_hidden(hidden, [2, 3], sha)
    assert torch.equal(decode_hidden(good, [2, 3], 4, sha), hidden)
    with pytest.raises(ValueError, match=r"has \[2, 3\] rows per prompt, the request asked for \[3, 2\]"):
        decode_hidden(good, [3, 2], 4, sha)
    with pytest.raises(ValueError, match=r"is \(5, 4\), expected \(5, 8\)"):
        decode_hidden(good, [2, 3], 8, sha)
    with pytest.raises(ValueError, match="whose head differs"):
        decode_hidden(good, [2, 3], 4, "0" * 64)
    with pytest.raises(ValueError, match="non-finite"):
        decode_hidden(encode_hidden(torch.tensor([[1.0, float("nan")]]), [1], sha), [1], 2, sha)
    with pytest.raises(ValueError, match="not a safetensors file"):
        decode_hidden(b'{"choices": []}', [1], 2, sha)


def test_a_malformed_answer_stops_the_step_with_the_reason(servers, tokenizer):
    teacher = _client(servers["a"], tokenizer)
    teacher.head_sha256 = "0" * 64  # as if the server's model changed after the run started
    with pytest.raises(TeacherServerError, match="whose head differs from the one loaded at start"):
        teacher.score(_batch(tokenizer), 1.0)


def _hidden_config(tmp_path, url, **overrides):
    values = {"method": "gkd", "teacher_url": url, "teacher_payload": "hidden", "teacher_concurrency": 2, "teacher_retries": 1,
              "teacher_timeout": 30.0, "lmbda": 0.0, **overrides}
    return make_config(tmp_path, **values)


def test_payload_fields_are_checked_and_read_only_where_they_apply(tmp_path):
    with pytest.raises(ValueError, match="teacher_payload must be one of"):
        _hidden_config(tmp_path, "http://127.0.0.1:1", teacher_payload="logits").validate()
    with pytest.raises(ValueError, match="teacher_hidden_dtype must be one of"):
        _hidden_config(tmp_path, "http://127.0.0.1:1", teacher_hidden_dtype="int8").validate()
    with pytest.raises(ValueError, match="teacher_logprobs is only read with"):
        _hidden_config(tmp_path, "http://127.0.0.1:1", teacher_logprobs=8).validate()
    with pytest.raises(ValueError, match="teacher_head is only read with"):
        make_config(tmp_path, method="gkd", teacher_url="http://127.0.0.1:1", teacher_head="x").validate()
    with pytest.raises(ValueError, match="method gold's objective takes \\['aligned'\\].*hidden states from teacher_cache"):
        # A cache holds states at the student's own tokens: gold cannot align them.
        make_config(tmp_path, method="gold", teacher_cache="x", teacher_payload="hidden", lmbda=0.0, student="byte-llama:2x32").validate()


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_runs_weights(servers, model_dirs, tmp_path):
    """Two CLI runs against the hidden-state server: one uninterrupted, one SIGKILLed after its step-2
    checkpoint and resumed; the final students are torch.equal."""
    from safetensors.torch import load_file

    from distill.cli import main

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in chat_rows(16)))
    flags = ["--method", "gkd", "--teacher_url", servers["a"], "--teacher_payload", "hidden", "--student",
             str(model_dirs["student"]), "--dataset", str(data), "--lmbda", "0.5", "--lmbda_schedule", "constant", "--seq_kd", "false", "--max_steps", "4",
             "--save_steps", "1",
             "--max_new_tokens", "6", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
             "--eval_before_after", "false", "--progress_bar", "false", "--learning_rate", "1e-2", "--loss_chunk_size", "16"]
    assert main(["train", *flags, "--output_dir", str(tmp_path / "full")]) == 0
    cut = tmp_path / "cut"
    kill_at_checkpoint([sys.executable, "-m", "distill", "train", *flags, "--output_dir", str(cut)], cut, step=2)
    assert not (cut / "model").exists()
    assert main(["train", "--resume", str(cut)]) == 0
    full, resumed = load_file(tmp_path / "full" / "model" / "model.safetensors"), load_file(cut / "model" / "model.safetensors")
    assert full.keys() == resumed.keys() and all(torch.equal(full[k], resumed[k]) for k in full)
    metrics = [json.loads(line) for line in (cut / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "loss" in m][-1] == 4


def test_a_run_trains_with_the_hidden_state_teacher_and_evaluates_through_it(servers, model_dirs, tmp_path):
    from distill.training.trainer import Distiller

    config = _hidden_config(tmp_path, servers["a"], lmbda=0.5, max_steps=2, eval_before_after=True, eval_max_new_tokens=4,
                            eval_max_prompts=3)
    config.student = str(model_dirs["student"])
    distiller = Distiller(config, train_dataset=datasets.Dataset.from_list(chat_rows(16)),
                          eval_dataset=datasets.Dataset.from_list(chat_rows(3, seed=5)))
    result = distiller.train()
    assert result["train"]["loss"] > 0 and isinstance(distiller.teacher, HiddenStateServerTeacher)
    assert result["eval"]["after"]["on_student_completions"]["tokens"] > 0


def test_iw_opd_reads_the_sampled_tokens_log_prob_from_the_hidden_states(servers, model_dirs, tokenizer, tmp_path):
    """iw_opd's advantage is the teacher's log-prob of each sampled token: from the server's hidden states and
    the head here, it equals the local teacher's."""
    from distill import DistillConfig
    from distill.objectives import StepContext
    from distill.objectives.student import student_loss
    from distill.training.trainer import Distiller
    from tests.helpers.training import FAST

    fields = {k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}  # gkd's mixing: not iw_opd's
    config = DistillConfig(**fields, method="iw_opd", teacher_url=servers["a"], teacher_payload="hidden", teacher_warmup_steps=0,
                           teacher_concurrency=2, teacher_retries=0, student=str(model_dirs["student"]),
                           output_dir=str(tmp_path / "run"))
    distiller = Distiller(config, train_dataset=datasets.Dataset.from_list(chat_rows(16)))
    mb = distiller.rollout.take(0, {})[0]
    objective = distiller.parts.method.objective(distiller.parts.config)
    losses = []
    for teacher in (distiller.teacher, _local(model_dirs["teacher"], tokenizer)):
        out = student_loss(distiller.student_model, len(tokenizer), mb, teacher.score(mb, 1.0), objective, StepContext("student"))
        losses.append(out.loss_sum.detach().double())
    assert losses[1] != 0 and abs(float(losses[0] - losses[1])) <= 1e-6 * abs(float(losses[1]))
    assert distiller.train()["steps"] == 2
