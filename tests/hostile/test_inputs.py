"""Hostile config values and models: each fails early (before any model loads where it can) with one
line naming the field or file and the fix; nothing trains in silence on a mismatched teacher or past the
models' context."""

from __future__ import annotations

import json
import shutil
import time

import datasets
import pytest

from distill import DistillConfig
from distill.cli import main
from distill.models import resolve_model_source
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import make_config, make_distiller


@pytest.mark.parametrize("field, value, message", [
    ("adam_beta1", 1.0, r"adam_beta1 must be in \[0, 1\)"),
    ("adam_beta2", -0.1, r"adam_beta2 must be in \[0, 1\)"),
    ("adam_beta2", 1.5, r"adam_beta2 must be in \[0, 1\)"),
    ("adam_epsilon", -1e-8, "adam_epsilon must be a finite number >= 0"),
    ("adam_epsilon", float("inf"), "adam_epsilon must be a finite number >= 0"),
    ("seed", -1, r"seed must be an integer in \[0, 2\*\*32\)"),
    ("seed", 2**32, r"seed must be an integer in \[0, 2\*\*32\)"),
    ("device", "tpu0", "device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got 'tpu0'"),
    ("device", "xla", "distill does not run on xla"),
])
def test_config_values_out_of_range_fail_before_anything_loads(field, value, message):
    with pytest.raises(ValueError, match=message):
        DistillConfig(**{field: value}).validate()


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://host:21", "http://", "host/v1"])
def test_a_teacher_url_without_scheme_and_host_fails_in_validation(url):
    with pytest.raises(ValueError, match=r"teacher_url must look like http://host:port \(scheme and host\)"):
        DistillConfig(teacher_url=url, lmbda=1.0, seq_kd=False, student="s").validate()


def test_cli_config_errors_come_before_the_student_is_looked_at(capsys):
    assert main(["train", "--adam_beta1", "1.5", "--student", "/no/such/model"]) == 2
    assert "adam_beta1 must be in [0, 1)" in capsys.readouterr().err


def test_eval_device_is_checked(capsys, tmp_path):
    assert main(["eval", str(tmp_path), "--teacher", str(tmp_path), "--device", "tpu0"]) == 2
    assert "device must be 'auto', 'cpu'" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------- models --
@pytest.fixture
def student_copy(model_dirs, tmp_path):
    target = tmp_path / "student"
    shutil.copytree(model_dirs["student"], target)
    return target


def test_a_model_directory_without_weights_is_named(student_copy):
    (student_copy / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"student: .* has a config.json but no weights"):
        resolve_model_source(str(student_copy), "student")


def test_a_config_json_that_is_not_json_is_named(student_copy):
    (student_copy / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"teacher: .*config.json is not valid JSON"):
        resolve_model_source(str(student_copy), "teacher")


@pytest.mark.parametrize("keep", [4, 100, -1000])
def test_a_truncated_model_safetensors_is_named_before_loading(student_copy, keep):
    weights = student_copy / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:keep] if keep > 0 else data[:keep])
    with pytest.raises(ValueError, match=r"student: .*model.safetensors is damaged or truncated"):
        resolve_model_source(str(student_copy), "student")


def test_a_safetensors_file_with_a_garbage_header_is_named(student_copy):
    weights = student_copy / "model.safetensors"
    weights.write_bytes((20).to_bytes(8, "little") + b"not a json header!!!" + b"\0" * 64)
    with pytest.raises(ValueError, match="its header is not valid"):
        resolve_model_source(str(student_copy), "student")


def test_a_directory_of_lora_adapters_only_is_named(tmp_path):
    (tmp_path / "adapters").mkdir()
    (tmp_path / "adapters" / "config.json").write_text("{}")
    (tmp_path / "adapters" / "adapter_config.json").write_text("{}")
    with pytest.raises(ValueError, match="holds LoRA adapters only"):
        resolve_model_source(str(tmp_path / "adapters"), "student")


def test_an_unreachable_hub_id_fails_at_once(monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: (_ for _ in ()).throw(ConnectionError("no route")))
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"teacher: 'some-org/some-model' is not a local path, and the hub cannot be "
                                         r"reached \(ConnectionError\)"):
        resolve_model_source("some-org/some-model", "teacher")
    assert time.perf_counter() - started < 5


def test_cli_train_with_a_truncated_student_fails_before_any_model_loads(student_copy, tmp_path, capsys, monkeypatch):
    import distill.models

    def never(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(distill.models, "load_causal_lm", never)
    weights = student_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:64])
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(8)))
    assert main(["train", "--student", str(student_copy), "--teacher", str(student_copy), "--dataset", str(data),
                 "--output_dir", str(tmp_path / "run"), "--eval_before_after", "false"]) == 2
    assert "model.safetensors is damaged or truncated" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------------- silent training --
def test_a_teacher_object_with_another_vocabulary_and_no_tokenizer_is_refused(tokenizer, tmp_path):
    teacher = tiny_lm(len(tokenizer) + 40, layers=2, seed=1, eos_token_id=tokenizer.eos_token_id)
    with pytest.raises(ValueError, match=rf"teacher_tokenizer: the teacher model has {len(tokenizer) + 40} vocabulary rows "
                                         rf"and the student {len(tokenizer)}"):
        make_distiller(tokenizer, tmp_path, teacher=teacher)


def test_the_same_teacher_with_its_tokenizer_named_is_compared_and_accepted(tokenizer, tmp_path):
    teacher = tiny_lm(len(tokenizer), layers=2, seed=1, eos_token_id=tokenizer.eos_token_id, pad_rows=40)
    assert make_distiller(tokenizer, tmp_path, teacher=teacher, teacher_tokenizer=tokenizer).parts.vocab_size == len(tokenizer)


def test_a_cross_tokenizer_method_needs_the_teacher_tokenizer(tokenizer, tmp_path):
    with pytest.raises(ValueError, match="teacher_tokenizer: method gold distils across tokenizers"):
        make_distiller(tokenizer, tmp_path, method="gold", lmbda=0.0)


@pytest.mark.parametrize("overrides, message", [
    ({"max_prompt_length": 500, "max_new_tokens": 48}, r"max_prompt_length \(500\) \+ max_new_tokens \(48\) = 548 tokens, "
                                                       r"more than the student's context of 512"),
    ({"max_prompt_length": 400, "eval_max_new_tokens": 200, "eval_before_after": True},
     r"max_prompt_length \(400\) \+ eval_max_new_tokens \(200\) = 600 tokens"),
])
def test_budgets_past_the_models_context_are_refused(tokenizer, tmp_path, overrides, message):
    eval_rows = datasets.Dataset.from_list(chat_rows(4)) if overrides.get("eval_before_after") else None
    with pytest.raises(ValueError, match=message):
        make_distiller(tokenizer, tmp_path, eval_dataset=eval_rows, **overrides)


def test_a_teacher_with_a_shorter_context_is_named(tokenizer, tmp_path):
    teacher = tiny_lm(len(tokenizer), layers=2, seed=1, eos_token_id=tokenizer.eos_token_id)
    teacher.config.max_position_embeddings = 64
    with pytest.raises(ValueError, match="more than the teacher's context of 64 tokens"):
        make_distiller(tokenizer, tmp_path, teacher=teacher, max_prompt_length=48, max_new_tokens=24)


def test_cache_teacher_checks_the_context(model_dirs, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(4)))
    assert main(["cache-teacher", "--teacher", str(model_dirs["teacher"]), "--dataset", str(data), "--out",
                 str(tmp_path / "cache"), "--max-prompt-length", "500", "--max-new-tokens", "48", "--top-k", "4", "--device", "cpu",
                 "--no-progress"]) == 2
    assert "--max-prompt-length (500) + --max-new-tokens (48) = 548 tokens" in capsys.readouterr().err


def test_eval_checks_the_context(model_dirs, tmp_path, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(4)))
    assert main(["eval", str(model_dirs["student"]), "--teacher", str(model_dirs["teacher"]), "--dataset", str(data),
                 "--split", "train", "--max-new-tokens", "600", "--device", "cpu"]) == 2
    assert "max_new_tokens (600) = 856 tokens, more than the student's context of 512" in capsys.readouterr().err


def test_resume_with_objects_missing_from_python_names_the_keywords(tokenizer, tmp_path):
    make_distiller(tokenizer, tmp_path, max_steps=1).train()
    from distill.rundir.directory import resume_config

    with pytest.raises(ValueError, match=r"Distiller\(config, student=\.\.\., teacher=\.\.\., train_dataset=\.\.\., resume=True\)"):
        Distiller(resume_config(tmp_path / "run"), tokenizer=tokenizer, resume=True)


def test_an_unknown_split_of_a_local_file_lists_the_available_ones(tokenizer, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(8)))
    with pytest.raises(ValueError, match=r"has no 'split' column, so its only split is 'train'"):
        Distiller(make_config(tmp_path, dataset=str(data), dataset_split="test"), tokenizer=tokenizer)
