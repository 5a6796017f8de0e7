"""Hidden-state caches (`cache-teacher --payload hidden`): the teacher's final hidden states and its head on
disk. From a float32 cache the loss and its gradient are the local teacher's (any beta, any temperature, two
teachers routed); bfloat16 and int8 are those states rounded; resume, checksums and refusals as the top-k cache."""

from __future__ import annotations

import json
import sys

import datasets
import pytest
import torch

from distill.commands.cache_teacher import CacheJob, run_cache_teacher
from distill.objectives import DivergenceObjective, StepContext
from distill.objectives.student import student_loss
from distill.signals import DenseSignal
from distill.teachers import LocalTeacher
from distill.teachers.cache import (
    HEAD_FILE,
    TeacherCache,
    cache_files,
    dequantize_hidden,
    quantize_hidden,
)
from distill.teachers.head import head_fingerprint
from distill.training.trainer import Distiller
from tests.conftest import tiny_lm
from tests.helpers.training import kill_at_checkpoint, make_config, with_holes


def _job(model_dir, data_file, out, **overrides) -> CacheJob:
    values = dict(teacher=str(model_dir), teacher_url=None, tokenizer=None, dataset=str(data_file), split="train", top_k=None,
                  out=str(out), temperature=None, max_new_tokens=12, max_prompt_length=48, shard_size=4, batch_size=3,
                  progress=False, device="cpu", payload="hidden")
    return CacheJob(**{**values, **overrides})


@pytest.fixture(scope="module")
def hidden_cache(model_dirs, data_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("hidden") / "teacher"
    run_cache_teacher(_job(model_dirs["teacher"], data_file, out))
    return out


def _config(tmp_path, cache, **overrides):
    values = {"method": "gkd", "teacher_cache": str(cache), "teacher_payload": "hidden", "lmbda": 0.0, "max_new_tokens": 12,
              **overrides}
    return make_config(tmp_path, **values)


def _local(directory, tokenizer):
    from transformers import AutoModelForCausalLM

    return LocalTeacher(AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32), len(tokenizer),
                        [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"))


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _loss_and_grad(distiller, mb, signal, beta, temperature):
    student = distiller.student_model
    student.zero_grad(set_to_none=True)
    out = student_loss(student, len(distiller.parts.tokenizer), mb, signal, DivergenceObjective.constant(beta, temperature, 16),
                       StepContext("dataset"))
    out.loss_sum.backward()
    grads = torch.cat([p.grad.flatten() for p in student.parameters() if p.grad is not None])
    return out.loss_sum.detach().double(), grads.double()


def test_the_manifest_and_files_describe_a_hidden_cache_within_its_byte_budget(hidden_cache, model_dirs, tokenizer):
    manifest = json.loads((hidden_cache / "manifest.json").read_text())
    local = _local(model_dirs["teacher"], tokenizer)
    assert manifest["payload"] == "hidden" and manifest["hidden_dtype"] == "float32" and manifest["top_k"] is None
    assert manifest["hidden_size"] == 32 and manifest["head_sha256"] == head_fingerprint(local.head)
    assert manifest["token_bytes_per_token"] == 4 * 32 + 2  # the states, and the token id
    own, foreign = cache_files(hidden_cache)
    assert hidden_cache / HEAD_FILE in own and not foreign
    cache = TeacherCache(hidden_cache)
    assert torch.equal(cache.head.weight, local.head.weight)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_loss_and_its_gradient_are_the_local_teachers(hidden_cache, model_dirs, data_file, tokenizer, tmp_path, beta, temperature):
    config = _config(tmp_path, hidden_cache, temperature=temperature)
    config.student = str(model_dirs["student"])
    distiller = Distiller(config, train_dataset=datasets.load_dataset("json", data_files=str(data_file), split="train"))
    whole = distiller.rollout.take(0, {})[0]
    for mb in (whole, with_holes(whole, tokenizer.pad_token_id)):  # a mask with holes reads the same cache
        cached = distiller.teacher.score(mb, temperature)
        assert isinstance(cached, DenseSignal) and cached.hidden.shape[0] == mb.num_completion_tokens
        loss, grad = _loss_and_grad(distiller, mb, cached, beta, temperature)
        local_loss, local_grad = _loss_and_grad(distiller, mb, _local(model_dirs["teacher"], tokenizer).score(mb, temperature),
                                                beta, temperature)
        # float32 hidden states read back against recomputed ones: the gradients 1.03e-6 apart at most, measured
        assert local_loss > 0 and _relative(loss, local_loss) < 1e-6 and _relative(grad, local_grad) < 2e-6


def test_two_hidden_caches_routed_by_teacher_id(hidden_cache, model_dirs, data_file, tokenizer, tmp_path):
    other_dir = tmp_path / "teacher-b"
    tiny_lm(len(tokenizer), layers=3, seed=9, eos_token_id=tokenizer.eos_token_id).save_pretrained(other_dir)
    tokenizer.save_pretrained(other_dir)
    run_cache_teacher(_job(other_dir, data_file, tmp_path / "b"))
    config = _config(tmp_path, f"a={hidden_cache},b={tmp_path / 'b'}", max_steps=2)
    config.student = str(model_dirs["student"])
    distiller = Distiller(config, train_dataset=datasets.load_dataset("json", data_files=str(data_file), split="train"))
    from distill.teachers.routed import RoutedTeacher

    mb = distiller.rollout.take(0, {})[0]
    local = RoutedTeacher({"a": _local(model_dirs["teacher"], tokenizer), "b": _local(other_dir, tokenizer)}, tokenizer.pad_token_id)
    for beta in (0.0, 1.0):
        loss, grad = _loss_and_grad(distiller, mb, distiller.teacher.score(mb, 1.0), beta, 1.0)
        local_loss, local_grad = _loss_and_grad(distiller, mb, local.score(mb, 1.0), beta, 1.0)
        assert _relative(loss, local_loss) < 1e-6 and _relative(grad, local_grad) < 1e-6
    result = distiller.train()
    assert {"loss/teacher/a", "loss/teacher/b"} <= set(result["train"])


@pytest.mark.parametrize("dtype, bound", [("bfloat16", 2 ** -8), ("int8", 1 / 254)])
def test_rounded_payloads_are_the_states_rounded(dtype, bound):
    torch.manual_seed(0)
    hidden = torch.randn(50, 16) * torch.logspace(-2, 1, 50)[:, None]  # rows of very different scales
    back = dequantize_hidden(quantize_hidden(hidden, dtype), dtype)
    error = (back - hidden).abs() / hidden.abs().amax(dim=1, keepdim=True)  # relative to each row's largest
    assert error.max() <= bound * 1.01 and not torch.equal(back, hidden)
    assert torch.equal(dequantize_hidden(quantize_hidden(hidden, "float32"), "float32"), hidden)


def test_a_bfloat16_cache_holds_the_float32_states_rounded(hidden_cache, model_dirs, data_file, tmp_path):
    run_cache_teacher(_job(model_dirs["teacher"], data_file, tmp_path / "bf16", hidden_dtype="bfloat16"))
    exact, rounded = TeacherCache(hidden_cache), TeacherCache(tmp_path / "bf16")
    manifest = json.loads((tmp_path / "bf16" / "manifest.json").read_text())
    assert manifest["token_bytes_per_token"] == 2 * 32 + 2
    for example_id in (0, 5, 9):
        assert torch.equal(rounded.get(example_id).hidden, exact.get(example_id).hidden.to(torch.bfloat16).float())


def test_rerun_resumes_and_refuses_other_settings_or_another_teacher(hidden_cache, model_dirs, data_file, tmp_path):
    manifest = json.loads((hidden_cache / "manifest.json").read_text())
    run_cache_teacher(_job(model_dirs["teacher"], data_file, hidden_cache))  # the same command: every shard is kept
    assert json.loads((hidden_cache / "manifest.json").read_text())["shards"] == manifest["shards"]
    with pytest.raises(ValueError, match="hidden_dtype: 'float32' vs 'int8'"):
        run_cache_teacher(_job(model_dirs["teacher"], data_file, hidden_cache, hidden_dtype="int8"))
    with pytest.raises(ValueError, match="head_sha256"):
        run_cache_teacher(_job(model_dirs["student"], data_file, hidden_cache))
    with pytest.raises(ValueError, match="--top-k and --temperature: a hidden-state cache"):
        run_cache_teacher(_job(model_dirs["teacher"], data_file, tmp_path / "x", top_k=8))


def test_a_run_refuses_a_cache_of_another_payload_tokenizer_or_head(hidden_cache, model_dirs, data_file, tmp_path, tokenizer):
    rows = datasets.load_dataset("json", data_files=str(data_file), split="train")
    config = _config(tmp_path, hidden_cache, teacher_payload="topk", teacher_logprobs=8)
    config.student = str(model_dirs["student"])
    with pytest.raises(ValueError, match="holds hidden states: set teacher_payload: hidden"):
        Distiller(config, train_dataset=rows)
    from tests.conftest import train_tiny_tokenizer

    other = tmp_path / "other-tokenizer"
    other_tokenizer = train_tiny_tokenizer(vocab_size=300)
    tiny_lm(len(other_tokenizer), layers=2, seed=2, eos_token_id=other_tokenizer.eos_token_id).save_pretrained(other)
    other_tokenizer.save_pretrained(other)
    config = _config(tmp_path, hidden_cache)
    config.student = str(other)
    with pytest.raises(ValueError, match="was made with another tokenizer"):
        Distiller(config, train_dataset=rows)
    # A head file swapped for another teacher's is caught by the manifest's fingerprint, nothing is deleted.
    import shutil

    altered = tmp_path / "altered"
    shutil.copytree(hidden_cache, altered)
    from distill.teachers.head import head_bytes

    (altered / HEAD_FILE).write_bytes(head_bytes(_local(model_dirs["student"], tokenizer).head))
    config = _config(tmp_path, altered)
    config.student = str(model_dirs["student"])
    with pytest.raises(ValueError, match="not the head of the teacher that wrote"):
        Distiller(config, train_dataset=rows)
    assert sorted(p.name for p in altered.iterdir()) == sorted(p.name for p in hidden_cache.iterdir())


def test_cli_writes_a_hidden_cache(model_dirs, data_file, tmp_path, capsys):
    from distill.cli import main

    out = tmp_path / "cli"
    assert main(["cache-teacher", "--teacher", str(model_dirs["teacher"]), "--dataset", str(data_file), "--payload", "hidden",
                 "--hidden-dtype", "int8", "--out", str(out), "--max-new-tokens", "12", "--max-prompt-length", "48",
                 "--no-progress", "--device", "cpu"]) == 0
    assert "hidden states in int8, H=32" in capsys.readouterr().out
    assert json.loads((out / "manifest.json").read_text())["token_bytes_per_token"] == 32 + 4 + 2
    assert main(["cache-teacher", "--teacher", str(model_dirs["teacher"]), "--dataset", str(data_file), "--payload", "hidden",
                 "--top-k", "8", "--out", str(tmp_path / "no")]) == 2


@pytest.mark.slow
def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_runs_weights(hidden_cache, model_dirs, data_file, tmp_path):
    from safetensors.torch import load_file

    from distill.cli import main

    flags = ["--method", "gkd", "--teacher_cache", str(hidden_cache), "--teacher_payload", "hidden", "--student",
             str(model_dirs["student"]), "--dataset", str(data_file), "--lmbda", "0", "--lmbda_schedule", "constant",
             "--seq_kd", "false", "--eval_before_after", "false", "--max_steps", "4", "--save_steps", "1", "--max_new_tokens", "12",
             "--max_prompt_length", "48", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
             "--progress_bar", "false", "--learning_rate", "1e-2", "--loss_chunk_size", "16", "--temperature", "0.7"]
    assert main(["train", *flags, "--output_dir", str(tmp_path / "full")]) == 0
    cut = tmp_path / "cut"
    kill_at_checkpoint([sys.executable, "-m", "distill", "train", *flags, "--output_dir", str(cut)], cut, step=2)
    assert main(["train", "--resume", str(cut)]) == 0
    full, resumed = load_file(tmp_path / "full" / "model" / "model.safetensors"), load_file(cut / "model" / "model.safetensors")
    assert all(torch.equal(full[k], resumed[k]) for k in full)
