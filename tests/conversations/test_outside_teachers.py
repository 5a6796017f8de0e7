"""Teachers outside the process on conversations: `distill serve-teacher` scores the tool-call loop's trajectories
(masks with holes at the environment's ids) as the local teacher does, and `distill cache-teacher` on a dataset of
conversations serves the same signal offline."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from distill.commands.cache_teacher import CacheJob, run_cache_teacher
from distill.objectives import DivergenceObjective, StepContext
from distill.objectives.student import student_loss
from distill.teachers import LocalTeacher
from distill.training.trainer import Distiller
from tests.conversations.test_render import CONVERSATION, TOOLS
from tests.conversations.test_training import conversation_rows, scripted_turns
from tests.helpers.training import make_config
from tests.teachers.servers import serve_teacher


@pytest.fixture(scope="module")
def local_teacher(model_dirs, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dirs["teacher"], dtype=torch.float32)
    return LocalTeacher(model, len(tokenizer), [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))


def _losses(student, vocab: int, batch, signals) -> list:
    objective = DivergenceObjective.constant(0.5, 1.0, 16)
    with torch.no_grad():
        return [student_loss(student, vocab, batch, signal, objective, StepContext(batch.source)) for signal in signals]


@pytest.mark.slow
def test_the_server_scores_the_tool_loops_trajectories_as_the_local_teacher(model_dirs, tokenizer, local_teacher, tmp_path,
                                                                             monkeypatch):
    import distill.training.student_sampler

    generate, call_ids, answer_ids = scripted_turns(tokenizer)
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    vocab = len(tokenizer)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(4)]
    with serve_teacher(model_dirs["teacher"], "--max-logprobs", str(vocab)) as (url, _):
        config = make_config(tmp_path, method="on_policy", teacher_url=url, student=str(model_dirs["student"]),
                             teacher_logprobs=vocab, teacher_retries=0, teacher_timeout=30.0, max_new_tokens=200,
                             max_prompt_length=300, tools=["tests.conversations.toolbox:plus"], max_turns=3, seq_kd=True,
                             lmbda_schedule="step")
        run = Distiller(config, train_dataset=datasets.Dataset.from_list(rows))
        batch = run.rollout.take(0, {})[0]
        assert all(False in c.mask and c.mask.count(True) == len(call_ids) + len(answer_ids) for c in batch.completions)
        remote = run.teacher.score(batch, 1.0)
        dense = local_teacher.score(batch, 1.0)
        served, local = _losses(run.student_model, vocab, batch, [remote, dense])
        assert float(served.num_tokens) == float(local.num_tokens) == batch.num_completion_tokens
        torch.testing.assert_close(served.loss_sum, local.loss_sum, rtol=1e-4, atol=1e-5)  # K = V: the whole distribution
        result = run.train()
    assert result["steps"] == 2 and result["train"]["loss"] > 0


def test_a_cache_of_conversations_serves_the_local_teachers_signal(model_dirs, tokenizer, local_teacher, tmp_path):
    """Every token of each conversation is cached (the tool turns too); a run reads the trained ones."""
    vocab = len(tokenizer)
    data = tmp_path / "conversations.jsonl"
    rows = conversation_rows(5) + [{"messages": CONVERSATION, "tools": TOOLS}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "cache"
    run_cache_teacher(CacheJob(teacher=str(model_dirs["teacher"]), teacher_url=None, tokenizer=None, dataset=str(data),
                               split="train", top_k=vocab, out=str(out), max_new_tokens=200, max_prompt_length=300,
                               shard_size=4, batch_size=3, progress=False, device="cpu"))
    config = make_config(tmp_path, method="gkd", teacher_cache=str(out), lmbda=0.0, seq_kd=False, lmbda_schedule="constant",
                         teacher_logprobs=vocab, max_new_tokens=200, max_prompt_length=300, student=str(model_dirs["student"]),
                         per_device_train_batch_size=3)
    run = Distiller(config, train_dataset=datasets.load_dataset("json", data_files=str(data), split="train"))
    batch = run.rollout.take(0, {})[0]
    assert all(False in c.mask for c in batch.completions)  # the tool turns and the template's glue are holes
    offline, local = _losses(run.student_model, vocab, batch, [run.teacher.score(batch, 1.0), local_teacher.score(batch, 1.0)])
    assert float(offline.num_tokens) == float(local.num_tokens) == batch.num_completion_tokens
    torch.testing.assert_close(offline.loss_sum, local.loss_sum, rtol=1e-2, atol=1e-3)  # the cache holds float16
    result = run.train()
    assert result["steps"] == 2 and result["train"]["loss"] > 0
