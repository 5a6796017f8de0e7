"""Parity with the reference library: distill's `gkd` recipe takes the same first step as TRL's GKDTrainer.

Both sides get the same tiny teacher and student (same weights) and the same four prompts with dataset
completions, as the same token ids. The micro-batch is off-policy (lmbda 0, seq_kd false): the deterministic
case, where both train on the dataset's completions. distill runs its real training loop (one optimizer step,
the backward recorded); TRL runs GKDTrainer.training_step on its own collator's batch (compute_loss, then
accelerator.backward). The losses and the student gradients agree to float32 rounding.

TRL's GKDConfig.temperature (default 0.9) is a sampling temperature only: compute_loss calls
generalized_jsd_loss without it, so its loss runs at temperature 1. The recipe therefore maps it to
`sampling_temperature` and keeps the loss `temperature` at 1; a loss temperature of 0.9 would not match.
"""

from __future__ import annotations

import copy

import datasets
import pytest
import torch
import yaml

from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import make_distiller
from tests.skip_guard import needs_extra


def trl_gkd():
    """TRL's GKD module; the calling test skips without the optional extra."""
    return needs_extra("trl.experimental.gkd", "trl")

# The recipe's loss fields; its sampling fields (sampling_temperature, top_p, top_k) are only read on-policy.
LOSS_FIELDS = ("method", "beta", "off_policy_beta", "temperature", "seq_kd", "lmbda_schedule")
ROWS = 4  # one micro-batch holding every row: unequal prompt and completion lengths, so padding matters


def gkd_recipe() -> dict:
    from distill.recipes import recipe_path

    return yaml.safe_load(recipe_path("gkd").read_text())


def token_rows(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) per row as a chat model sees them: the prompt rendered by the chat template with
    the generation prompt, the completion's text tokens followed by EOS (<|im_end|>)."""
    rows = []
    for row in chat_rows(ROWS):
        prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(row["completion"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append((prompt_ids, completion_ids))
    return rows


def models(tokenizer):
    teacher = tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id)
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    return teacher, student


def trl_step(tokenizer, tmp_path, teacher, student, beta: float, temperature: float):
    """TRL's loss and student gradients for one off-policy micro-batch of every row, through GKDTrainer.training_step."""
    args = trl_gkd().GKDConfig(output_dir=str(tmp_path / "trl"), report_to="none", use_cpu=True, bf16=False,
                             lmbda=0.0, beta=beta, temperature=temperature, seq_kd=False, per_device_train_batch_size=ROWS,
                             gradient_accumulation_steps=1)
    # Pre-tokenized rows: the collator takes the prompt/completion boundary from completion_mask (it still reads a
    # prompt text first, which is then unused).
    examples = [{"prompt": tokenizer.decode(p), "input_ids": p + c, "completion_mask": [0] * len(p) + [1] * len(c)}
                for p, c in token_rows(tokenizer)]
    trainer = trl_gkd().GKDTrainer(model=copy.deepcopy(student), teacher_model=copy.deepcopy(teacher), args=args,
                                 train_dataset=datasets.Dataset.from_list(examples), processing_class=tokenizer)
    batch = trainer.data_collator(examples)
    # What TRL trains: labels on the completion tokens, EOS included.
    assert int((batch["labels"] != -100).sum()) == sum(sum(e["completion_mask"]) for e in examples)
    # As Trainer's loop does per optimizer step: count the step's label tokens, then one training_step per micro-batch.
    batches, num_items_in_batch = trainer.get_batch_samples(iter([batch]), 1, trainer.args.device)
    trainer.current_gradient_accumulation_steps = len(batches)
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.training_step(trainer.model, batches[0], num_items_in_batch)  # lmbda 0, seq_kd false: dataset completions
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters()}
    return loss.item(), grads


def distill_step(tokenizer, tmp_path, teacher, student, **overrides):
    """distill's loss (the recorded backward) and student gradients for the first optimizer step."""
    rows = [{"prompt": r["prompt"], "completion": r["completion"]} for r in chat_rows(ROWS)]
    distiller = make_distiller(tokenizer, tmp_path, rows=rows, teacher=copy.deepcopy(teacher), student=copy.deepcopy(student),
                               lmbda=0.0, per_device_train_batch_size=ROWS, gradient_accumulation_steps=1, max_steps=1,
                               max_new_tokens=64, max_prompt_length=256, **overrides)
    recorded = []
    original_backward = distiller.parts.accelerator.backward

    def recording_backward(loss, **kwargs):
        original_backward(loss, **kwargs)
        grads = {name: p.grad.detach().clone() for name, p in distiller.student_model.named_parameters()}
        recorded.append((loss.item(), grads))

    distiller.parts.accelerator.backward = recording_backward
    distiller.train()
    assert len(recorded) == 1, "one micro-batch, one backward"
    return recorded[0]


def test_recipe_is_gkd_with_one_beta_for_every_source():
    recipe = gkd_recipe()
    defaults = trl_gkd().GKDConfig.__dataclass_fields__
    assert recipe["lmbda"] == defaults["lmbda"].default == 0.5 and recipe["lmbda_schedule"] == "constant"
    assert recipe["beta"] == defaults["beta"].default == 0.5 and recipe["off_policy_beta"] is None
    assert recipe["seq_kd"] is defaults["seq_kd"].default is False
    assert recipe["sampling_temperature"] == defaults["temperature"].default == 0.9 and recipe["temperature"] == 1.0
    assert recipe["max_new_tokens"] == defaults["max_new_tokens"].default
    assert (recipe["top_p"], recipe["top_k"]) == (1.0, 0)


def test_first_step_loss_and_gradient_equal_trl_gkd(tokenizer, tmp_path):
    recipe = gkd_recipe()
    teacher, student = models(tokenizer)
    theirs_loss, theirs_grads = trl_step(tokenizer, tmp_path, teacher, student, recipe["beta"], recipe["sampling_temperature"])
    ours_loss, ours_grads = distill_step(tokenizer, tmp_path, teacher, student, **{k: recipe[k] for k in LOSS_FIELDS})

    assert ours_loss == pytest.approx(theirs_loss, rel=1e-5)
    assert ours_grads.keys() == theirs_grads.keys()
    for name, grad in ours_grads.items():
        torch.testing.assert_close(grad, theirs_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_a_loss_temperature_of_trl_sampling_temperature_would_not_match(tokenizer, tmp_path):
    recipe = gkd_recipe()
    teacher, student = models(tokenizer)
    theirs_loss, _ = trl_step(tokenizer, tmp_path, teacher, student, recipe["beta"], recipe["sampling_temperature"])
    fields = {**{k: recipe[k] for k in LOSS_FIELDS}, "temperature": recipe["sampling_temperature"]}
    ours_loss, _ = distill_step(tokenizer, tmp_path, teacher, student, **fields)
    assert ours_loss != pytest.approx(theirs_loss, rel=1e-3)


def test_trl_chatml_collator_renders_the_same_tokens_plus_the_newline_after_eos(tokenizer):
    """TRL's default collation of `messages` rows gives the same prompt and completion ids, except that it also trains
    the chat template's newline after <|im_end|>: one label past EOS per dataset completion (on-policy completions
    end at EOS in TRL too). distill ends every completion at its first EOS; the parity test feeds TRL those ids."""
    from trl.experimental.utils import DataCollatorForChatML

    rows = chat_rows(ROWS)
    messages = [{"messages": r["prompt"] + [{"role": "assistant", "content": r["completion"]}]} for r in rows]
    batch = DataCollatorForChatML(tokenizer=tokenizer)(messages)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    for row, (prompt_ids, completion_ids) in enumerate(token_rows(tokenizer)):
        prompt = batch["prompts"][row][batch["prompt_attention_mask"][row].bool()].tolist()
        labels = [t for t in batch["labels"][row].tolist() if t != -100]
        assert prompt == prompt_ids
        assert labels == completion_ids + newline
