"""method gold in the one training loop: every completion source, evaluation, set-up errors, the recipe."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
import torch

from distill.config import DistillConfig
from distill.generation.sample import Sample
from distill.training.trainer import Distiller
from tests.conftest import tiny_lm
from tests.distributed import assert_same_gradients, first_step_gradient, run_in_processes
from tests.helpers.training import make_config

RECIPE = Path(__file__).resolve().parents[3] / "src" / "distill" / "recipes" / "gold.yaml"
ANSWERS = ["Café au lait, s'il vous plaît ☕", "東京は日本の首都です。", "Zoë a dit « déjà vu » 🙂", "naïve façade 👍🏽 ok"]


def gold_rows(n: int = 8) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"Question {i}: que veut dire « {ANSWERS[i % 4][:6]} » ? 🤔"}],
             "completion": ANSWERS[i % 4]} for i in range(n)]


def gold_distiller(tokenizer, smol_tokenizer, smol_teacher, tmp_path, **overrides):
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    values = dict(method="gold", max_new_tokens=10, max_prompt_length=40, **overrides)
    config = make_config(tmp_path, **values)
    eval_rows = datasets.Dataset.from_list(gold_rows(4)) if config.eval_before_after else None
    return Distiller(config, student=student, teacher=smol_teacher, tokenizer=tokenizer, teacher_tokenizer=smol_tokenizer,
                     train_dataset=datasets.Dataset.from_list(gold_rows()), eval_dataset=eval_rows)


def test_gold_trains_on_student_and_teacher_samples_and_reports_the_aligned_divergence(tokenizer, smol_tokenizer, smol_teacher, tmp_path):
    distiller = gold_distiller(tokenizer, smol_tokenizer, smol_teacher, tmp_path, lmbda=0.5, seq_kd=True, gradient_accumulation_steps=4,
                               max_steps=1, eval_before_after=True, eval_max_prompts=2, eval_max_new_tokens=8, eval_batch_size=2,
                               eval_examples=1)
    before = {n: p.detach().clone() for n, p in distiller.student_model.named_parameters()}
    result = distiller.train()
    train = result["train"]
    assert train["micro_batches/student"] > 0 and train["micro_batches/teacher"] > 0
    assert torch.isfinite(torch.tensor(train["loss"])) and train["loss"] > 0
    moved = [n for n, p in distiller.student_model.named_parameters() if not torch.equal(before[n], p)]
    assert "lm_head.weight" in moved or "model.embed_tokens.weight" in moved
    for when in ("before", "after"):
        metrics = result["eval"][when]["on_teacher_completions"]
        assert set(metrics) == {"aligned_divergence", "tokens"} and metrics["tokens"] > 0 and metrics["aligned_divergence"] > 0
    report = (Path(result["run_dir"]) / "eval" / "eval.md").read_text()
    assert "aligned divergence" in report and "Aligned divergence (ULD) on teacher completions" in report
    card = (Path(result["run_dir"]) / "model" / "README.md").read_text()
    assert "2402.12030" in card and "ULD" in card


@pytest.mark.parametrize("hybrid", [False, True])
def test_gold_trains_on_dataset_completions(tokenizer, smol_tokenizer, smol_teacher, tmp_path, hybrid):
    extra = dict(uld_use_hybrid_loss=True, uld_crossentropy_weight=0.1, beta=0.0) if hybrid else {}
    distiller = gold_distiller(tokenizer, smol_tokenizer, smol_teacher, tmp_path, lmbda=0.0, max_steps=1, **extra)
    assert (distiller.teacher.settings.hybrid is not None) == hybrid
    if hybrid:  # adaptive weights: the matched share of the teacher vocabulary (the byte alphabet and a few merges)
        assert 0 < distiller.teacher.settings.matched_weight < 0.05
    result = distiller.train()
    assert result["train"]["micro_batches/dataset"] == 2 and result["train"]["loss"] > 0


def test_gold_loss_does_not_depend_on_the_micro_batch_split(tokenizer, smol_tokenizer, smol_teacher, tmp_path):
    losses = []
    for batch, accumulation in ((4, 1), (1, 4)):
        distiller = gold_distiller(tokenizer, smol_tokenizer, smol_teacher, tmp_path / f"{batch}x{accumulation}", lmbda=0.0, max_steps=1,
                                   per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation)
        losses.append(distiller.train()["train"]["loss"])
    assert abs(losses[0] - losses[1]) <= 1e-5 * losses[0]


def _gold_step_gradient(rank, world_size, tmp, batch, accumulation, tokenizer, smol_tokenizer, smol_teacher):
    """One optimizer step on dataset completions: this process's gradient (before the optimizer) and the logged metrics."""
    torch.manual_seed(0)
    rows = gold_rows()
    for i, row in enumerate(rows):  # very unequal lengths, so that no two processes or micro-batches hold as many tokens
        row["completion"] = ((row["completion"] + " ") * 2)[: 2 + 4 * i]
    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    config = make_config(Path(tmp) / f"rank{rank}", method="gold", lmbda=0.0, max_grad_norm=0.0, max_new_tokens=40, max_prompt_length=40,
                         per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation)
    distiller = Distiller(config, student=student, teacher=smol_teacher, tokenizer=tokenizer, teacher_tokenizer=smol_tokenizer,
                          train_dataset=datasets.Dataset.from_list(rows))
    return first_step_gradient(distiller)


@pytest.mark.slow
def test_gold_gradient_is_split_invariant_across_processes_and_micro_batches(tokenizer, smol_tokenizer, smol_teacher, tmp_path):
    """1 process x 1 micro-batch of the 8 prompts gives the gradient of 2 processes x 2 micro-batches of 2 (gloo)."""
    models = (tokenizer, smol_tokenizer, smol_teacher)
    single = _gold_step_gradient(0, 1, str(tmp_path / "single"), 8, 1, *models)
    ranks = run_in_processes(_gold_step_gradient, world_size=2, args=(str(tmp_path / "multi"), 2, 2, *models))
    assert any(grad.abs().sum() > 0 for grad in single["grads"].values())
    for rank in ranks:
        assert_same_gradients(rank["grads"], single["grads"])
    for key in ("loss", "completion_length", "grad_norm"):
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5), key
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


def test_training_lowers_the_aligned_divergence(tokenizer, smol_tokenizer, tmp_path):
    # A teacher with peaked next-token distributions (scaled logits), as trained models have: its samples for the
    # held-out prompts (the first training prompts) are then close to the ones the student trains on (seq_kd).
    teacher = tiny_lm(len(smol_tokenizer), layers=2, seed=11, eos_token_id=smol_tokenizer.eos_token_id)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(30.0)
    distiller = gold_distiller(tokenizer, smol_tokenizer, teacher, tmp_path, lmbda=0.0, seq_kd=True, max_steps=8, learning_rate=2e-2, uld_crossentropy_weight=1.0,
                               eval_before_after=True, eval_max_prompts=4, eval_max_new_tokens=8, eval_batch_size=4, eval_examples=1)
    metrics = distiller.train()["eval"]
    before = metrics["before"]["on_teacher_completions"]["aligned_divergence"]
    after = metrics["after"]["on_teacher_completions"]["aligned_divergence"]
    assert after < 0.5 * before, (before, after)


def test_a_tokenizer_without_byte_spans_fails_at_set_up(smol_tokenizer, smol_teacher, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    wp = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wp.pre_tokenizer = pre_tokenizers.Whitespace()
    wp.train_from_iterator(ANSWERS, trainers.WordPieceTrainer(vocab_size=120, special_tokens=["[UNK]", "[SEP]"]))
    student_tokenizer = PreTrainedTokenizerFast(tokenizer_object=wp, unk_token="[UNK]", eos_token="[SEP]", pad_token="[SEP]")
    student = tiny_lm(len(student_tokenizer), layers=1, seed=2, eos_token_id=student_tokenizer.eos_token_id)
    # Text prompts: this tokenizer has no chat template either, and that error would come first.
    rows = [{**row, "prompt": row["prompt"][0]["content"]} for row in gold_rows()]
    with pytest.raises(ValueError, match="student tokenizer: method gold"):
        Distiller(make_config(tmp_path, method="gold"), student=student, teacher=smol_teacher, tokenizer=student_tokenizer,
                  teacher_tokenizer=smol_tokenizer, train_dataset=datasets.Dataset.from_list(rows))


def test_recipe_validates_and_uses_a_cross_tokenizer_pair():
    config = DistillConfig.from_yaml(RECIPE).validate()
    assert config.method == "gold" and config.teacher == "smollm2-135m-instruct" and config.student.startswith("byte-llama")


@pytest.mark.parametrize("values, match, accepted", [
    (dict(method="gkd", uld_use_hybrid_loss=True), "not read by method gkd .methods gold read it.", dict(method="gold")),
    (dict(method="gkd", uld_crossentropy_weight=0.5), "not read by method gkd .methods gold read it.", dict(method="gold")),
    (dict(method="gold", beta=0.2), "beta is only read with uld_use_hybrid_loss", dict(uld_use_hybrid_loss=True)),
    (dict(method="gold", uld_hybrid_matched_weight=0.5, uld_hybrid_unmatched_weight=0.5), "only read with uld_use_hybrid_loss",
     dict(uld_use_hybrid_loss=True)),
    (dict(method="gold", uld_use_hybrid_loss=True, uld_hybrid_matched_weight=0.5), "set both", dict(uld_hybrid_unmatched_weight=0.5)),
    (dict(method="gold", uld_crossentropy_weight=-1.0), "uld_crossentropy_weight must be", dict(uld_crossentropy_weight=0.5)),
])
def test_gold_fields_are_read_or_rejected(values, match, accepted):
    """Each rejected setting, changed only where `accepted` says (the setting where the field is read), validates."""
    with pytest.raises(ValueError, match=match):
        DistillConfig(**values).validate()
    DistillConfig(**{**values, **accepted}).validate()


def test_a_step_of_empty_teacher_completions_trains_without_a_crash(tokenizer, smol_tokenizer, smol_teacher, tmp_path):
    """A teacher sample that is half a character re-encodes to no student token at all (see to_student)."""
    distiller = gold_distiller(tokenizer, smol_tokenizer, smol_teacher, tmp_path, lmbda=0.0, seq_kd=True, max_steps=1)
    half_character = smol_tokenizer.convert_tokens_to_ids(["ð"])
    assert distiller.teacher.to_student(half_character, True, 10) == ([], True)
    distiller.teacher.generate = lambda prompts, sampling, batch_size=None, examples=None, seeds=None, extras=None: [Sample([], True) for _ in prompts]
    before = {n: p.detach().clone() for n, p in distiller.student_model.named_parameters()}
    distiller.setup()
    micro_batches = distiller.rollout.take(0, {})
    assert all(mb.input_ids.dtype == torch.long and mb.num_completion_tokens == 0 for mb in micro_batches)
    result = distiller.train()
    assert result["steps"] == 1 and result["train"]["completion_length/teacher"] == 0
    assert all(torch.equal(before[n], p) for n, p in distiller.student_model.named_parameters())  # nothing to learn from
