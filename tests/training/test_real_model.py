"""The packaged SmolLM2-135M-Instruct teacher end to end: GGUF loading, a layer-dropped student, two
optimizer steps, the evaluation, and a final model that plain transformers loads."""

import json

import pytest
import torch

from distill import DistillConfig
from distill.models import resolve_model_source
from distill.training.trainer import Distiller


@pytest.fixture(scope="module")
def smollm2():
    try:
        return resolve_model_source("smollm2-135m-instruct", "teacher")
    except ValueError as error:
        pytest.fail(f"{error} (the README's test command installs it)")


def test_two_steps_with_the_packaged_teacher(smollm2, tmp_path):
    from transformers import AutoModelForCausalLM

    config = DistillConfig(
        student_init="keep_every:10", max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=1,
        max_new_tokens=8, seq_kd=True, lmbda=0.5, logging_steps=1, save_steps=1, eval_max_prompts=2,
        eval_max_new_tokens=8, eval_examples=1, progress_bar=False, output_dir=str(tmp_path / "run"),
    )
    distiller = Distiller(config)
    assert distiller.parts.vocab_size == 49152 and distiller.parts.tokenizer.eos_token == "<|im_end|>"
    assert distiller.student_model.config.num_hidden_layers == 3  # layers 0, 10, 20 of 30
    result = distiller.train()
    assert result["steps"] == 2
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    before = report["metrics"]["before"]["on_teacher_completions"]
    assert before["tokens"] > 0 and before["forward_kl"] > 0
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    assert loaded.config.num_hidden_layers == 3 and getattr(loaded.config, "quantization_config", None) is None
    for name, p in distiller.student_model.named_parameters():
        assert torch.equal(loaded.state_dict()[name], p.detach()), name
