"""method sdft end to end (and sft, its baseline): config and data rules, teacher prompts, the three
self-teacher kinds, EMA updates and resume, masked rows and skipped tokens, generate_from_teacher, split
invariance and token-weighted metrics over processes, bf16 autocast, eval and model cards."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from distill import DistillConfig
from distill.batch import Completion, collate, skipping_first, untrained
from distill.cli import main
from distill.data import Example
from distill.generation.sample import Sample
from distill.methods.self_teacher_prompts import (
    DEFAULT_TEACHER_PROMPT_TEMPLATE,
    check_template,
    fill,
)
from distill.rundir.directory import resume_config
from distill.teachers.hidden import backbone_hidden, predicting_positions
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm, train_tiny_tokenizer
from tests.distributed import assert_same_gradients, first_step_gradient, run_in_processes
from tests.helpers.training import FAST

# FAST minus GKD's mixing fields (not read by sdft), with a teacher prompt budget the tiny models' context fits.
SDFT = {**{k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}, "method": "sdft",
        "max_teacher_prompt_length": 96}
SFT = {**{k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}, "method": "sft"}


def context_rows(n: int, seed: int = 0) -> list[dict]:
    rows = chat_rows(n, seed=seed)
    for i, row in enumerate(rows):
        row["privileged_context"] = f"The answer is {'number ' * (1 + i % 3)}{i}."
    return rows


def config_for(tmp_path, base=SDFT, **overrides) -> DistillConfig:
    return DistillConfig(**{**base, "output_dir": str(tmp_path / "run"), **overrides})


def student(tokenizer):
    return tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)


def distiller(tokenizer, tmp_path, rows=None, config=None, resume=False, **overrides) -> Distiller:
    config = config or config_for(tmp_path, **overrides)
    return Distiller(config, student=student(tokenizer), tokenizer=tokenizer, resume=resume,
                     train_dataset=datasets.Dataset.from_list(rows if rows is not None else context_rows(16)))


def fixed_completions(model, prompts, sampling, *args, with_log_probs=False, **kwargs):
    """Deterministic "samples" of unequal lengths (a function of the prompt); no log-probs recorded."""
    out = [[5 + (p * 7) % 40 for p in prompt[-(2 + len(prompt) % 9):]] for prompt in prompts]
    return [Sample(ids, False, [-1.0] * len(ids) if with_log_probs else None) for ids in out]


# ------------------------------------------------------------------------------------ bad input --
@pytest.mark.parametrize("overrides, message", [
    ({"teacher_prompt_template": "{prompt} only"}, r"teacher_prompt_template must contain \{privileged_context\}"),
    ({"teacher_prompt_template": "{prompt} {privileged_context} {answer}"}, r"has the placeholder \{answer\}"),
    ({"teacher_prompt_template": "{prompt!r} {privileged_context}"}, "without a format spec or conversion"),
    ({"teacher_prompt_template": "{prompt} {privileged_context"}, "is not a valid template"),
    ({"teacher_update_rate": 0.0}, r"teacher_update_rate must be in \(0, 1\]"),
    ({"teacher_update_rate": 1.5}, r"teacher_update_rate must be in \(0, 1\]"),
    ({"teacher_sync_steps": 0}, "teacher_sync_steps must be >= 1"),
    ({"teacher_model_kind": "frozen"}, "teacher_model_kind must be one of"),
    ({"teacher_model_kind": "base", "teacher_update_rate": 0.1}, "teacher_update_rate is only read with teacher_model_kind: ema"),
    ({"teacher": "some/model"}, "teacher: method sdft takes no teacher model"),
    ({"teacher_url": "http://127.0.0.1:9"}, "teacher_url: method sdft takes no external teacher"),
    ({"teacher_cache": "some/cache"}, "teacher_cache: method sdft takes no external teacher"),
    ({"distillation_mode": "sampled_token"}, "sampled_token estimates reverse KL on the sampled token only: set beta: 1"),
    ({"distillation_mode": "sampled_token", "beta": 1.0, "generate_from_teacher": True}, "with generate_from_teacher the teacher samples"),
    ({"distillation_mode": "topk"}, "distillation_mode must be one of"),
    ({"distillation_mode": "topk_logits", "distillation_topk": 0}, "distillation_topk must be >= 1"),
    ({"distillation_topk": 5}, "distillation_topk is only read with distillation_mode: topk_logits"),
    ({"distillation_is_clip": 3.0}, "distillation_is_clip is only read with num_iterations > 1"),
    ({"num_iterations": 2, "distillation_is_clip": -1.0}, "distillation_is_clip must be a finite number > 0"),
    ({"missing_privileged_context": "ignore"}, "missing_privileged_context must be 'error' or 'skip'"),
    ({"num_loss_tokens_to_skip": -1}, "num_loss_tokens_to_skip must be >= 0"),
    ({"lmbda": 0.3}, "lmbda is not read by method sdft"),
    ({"teacher_top_p": 0.9}, "teacher_top_p is only read with generate_from_teacher: true"),
])
def test_bad_sdft_settings_fail_before_any_model_loads(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        config_for(tmp_path, **overrides).validate()


@pytest.mark.parametrize("base, rows, message", [
    (SDFT, chat_rows(6), "dataset: no row has a 'privileged_context'"),
    (SDFT, [dict(r, privileged_context=None) if i == 3 else r for i, r in enumerate(context_rows(6))],
     r"dataset row 3 has no 'privileged_context' \(1 of 6 rows lack one\).*missing_privileged_context: skip"),
    (SFT, chat_rows(6, with_completion=False), "dataset row 0 has no completion .*method sft trains on the dataset's completions"),
])
def test_dataset_problems_fail_before_any_model_loads(tmp_path, base, rows, message):
    """The student path does not exist: had the model been loaded first, that would be the error."""
    config = config_for(tmp_path, base=base, student="/no/such/model")
    with pytest.raises(ValueError, match=message):
        Distiller(config, train_dataset=datasets.Dataset.from_list(rows))


@pytest.mark.parametrize("base", [SDFT, SFT])
@pytest.mark.parametrize("given, fix", [
    (lambda rows: rows, r"got a list; wrap it with datasets.Dataset.from_list\(rows\)"),
    (lambda rows: {"prompt": [r["prompt"] for r in rows]}, r"got a dict; wrap it with datasets.Dataset.from_dict\(columns\)"),
    (lambda rows: __import__("pandas").DataFrame(rows), r"got a DataFrame; wrap it with datasets.Dataset.from_pandas\(df\)"),
    (lambda rows: datasets.Dataset.from_list(rows).to_iterable_dataset(), "an IterableDataset is not supported; materialise it"),
])
def test_the_dataset_type_is_checked_when_the_run_is_built(tmp_path, base, given, fix):
    with pytest.raises(TypeError, match=fix):
        Distiller(config_for(tmp_path, base=base, student="/no/such/model"), train_dataset=given(context_rows(4)))


# ------------------------------------------------------------------------------- teacher prompts --
def test_a_conversation_ending_after_its_last_user_turn_is_refused_with_its_row(tmp_path):
    """The teacher prompt replaces the last user turn; an assistant turn after it would follow the privileged
    context (the teacher would continue that turn). Refused, naming the row, before any model loads."""
    from distill.methods.self_teacher_prompts import TeacherPrompts

    rows = context_rows(6)
    rows[4]["prompt"] = rows[4]["prompt"] + [{"role": "assistant", "content": "An earlier answer."}]
    with pytest.raises(ValueError, match=r"dataset row 4: the chat prompt ends with a 'assistant' turn after its last user turn"):
        Distiller(config_for(tmp_path, student="/no/such/model"), train_dataset=datasets.Dataset.from_list(rows))
    with pytest.raises(ValueError, match="ends with a 'assistant' turn"):
        fill(DEFAULT_TEACHER_PROMPT_TEMPLATE, rows[4]["prompt"], "ctx")
    example = Example(7, rows[4]["prompt"], None, privileged_context="ctx")
    with pytest.raises(ValueError, match="^row 7: the chat prompt ends with"):
        TeacherPrompts(None, DEFAULT_TEACHER_PROMPT_TEMPLATE).ids(example)


def test_the_template_edits_the_last_user_turn_and_keeps_the_others():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Capital of Veltoria?"}]
    teacher = fill("Q: {prompt}\nFact: {privileged_context}", chat, "Marusk is its capital.")
    assert teacher[:3] == chat[:3] and chat[3]["content"] == "Capital of Veltoria?"  # the input is not changed
    assert teacher[3] == {"role": "user", "content": "Q: Capital of Veltoria?\nFact: Marusk is its capital."}
    assert fill("{privileged_context} | {prompt}", "plain text", "ctx") == "ctx | plain text"
    assert fill("{{literal}} {prompt} {privileged_context}", "a", "b") == "{literal} a b"
    with pytest.raises(ValueError, match="without a user turn"):
        fill(DEFAULT_TEACHER_PROMPT_TEMPLATE, [{"role": "system", "content": "x"}], "ctx")
    check_template(DEFAULT_TEACHER_PROMPT_TEMPLATE, "teacher_prompt_template")


def test_truncated_teacher_prompts_keep_their_end_and_are_counted(tokenizer, tmp_path):
    run = distiller(tokenizer, tmp_path, max_teacher_prompt_length=24, max_steps=1)
    example = run.parts.train_examples[0]
    ids, truncated, _ = run.teacher.teacher_prompt(example)
    full = tokenizer.apply_chat_template(fill(DEFAULT_TEACHER_PROMPT_TEMPLATE, example.prompt, example.privileged_context),
                                         tokenize=False, add_generation_prompt=True)
    full_ids = tokenizer(full, add_special_tokens=False)["input_ids"]
    assert truncated and len(full_ids) > 24 and ids == full_ids[-24:]  # the end: the context and the assistant header
    assert run.train()["train"]["self_teacher/prompt_truncated"] == 1.0


# ---------------------------------------------------------------------------------- the teacher --
def test_the_self_teacher_scores_the_students_positions_after_its_own_prompt(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", fixed_completions)
    rows = context_rows(8)
    rows[1]["privileged_context"] = None
    run = distiller(tokenizer, tmp_path, rows=rows, teacher_model_kind="base", num_loss_tokens_to_skip=2,
                    missing_privileged_context="skip")
    run.setup()
    for mb in run.rollout.take(0, {}):
        signal = run.teacher.score(mb, 1.0)
        assert signal.hidden.shape[0] == mb.num_completion_tokens
        expected = []
        model = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id).eval()  # the initial weights
        for c in mb.completions:
            if c.example.privileged_context is None:  # skipped row: no position at all
                assert not any(c.mask)
                continue
            ids = run.teacher.teacher_prompt(c.example)[0]
            assert tokenizer.decode(ids).count(c.example.privileged_context) == 1
            with torch.no_grad():
                hidden = backbone_hidden(model, torch.tensor([ids + c.completion_ids]), torch.ones(1, len(ids) + len(c.completion_ids)))
            expected.append(hidden[0, len(ids) - 1 + 2 : len(ids) + len(c.completion_ids) - 1])  # first 2 tokens skipped
        torch.testing.assert_close(signal.hidden, torch.cat(expected), rtol=1e-5, atol=1e-6)
        assert signal.rows == len(mb.completions)


def test_skipped_rows_and_tokens_leave_the_loss_and_the_denominator():
    completions = [Completion([1, 2], [3, 4, 5, 6], "student", rollout_log_probs=[-1.0, -2.0, -3.0, -4.0],
                              trained_mask=skipping_first(4, 1)),
                   Completion([1], [7, 8], "student", rollout_log_probs=[-5.0, -6.0], trained_mask=untrained(2)),
                   Completion([1, 2, 3], [9], "student", rollout_log_probs=[-7.0], trained_mask=skipping_first(1, 1))]
    mb = collate(completions, "student", 0)
    assert mb.completion_mask.tolist() == [[False, False, False, True, True, True],
                                           [False, False, False, False, False, False],
                                           [False, False, False, False, False, False]]
    assert mb.num_completion_tokens == 3 and mb.rollout_log_probs.tolist() == [-2.0, -3.0, -4.0]
    assert mb.input_ids.dtype == torch.long and mb.input_ids[1, :3].tolist() == [1, 7, 8]


def test_at_step_zero_the_three_teacher_kinds_give_one_gradient(tokenizer, tmp_path, monkeypatch):
    """base (a copy), live (the student itself under no_grad) and ema (a copy) hold the same weights before
    the first update: any gradient leaking through a live teacher's side would make them differ."""
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", fixed_completions)
    gradients = {}
    for kind in ("base", "live", "ema"):
        run = distiller(tokenizer, tmp_path / kind, rows=context_rows(8), teacher_model_kind=kind, max_grad_norm=0.0)
        gradients[kind] = first_step_gradient(run)["grads"]
    for name, grad in gradients["base"].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(gradients["live"][name], grad, rtol=1e-5, atol=1e-8, msg=name)
        torch.testing.assert_close(gradients["ema"][name], grad, rtol=1e-5, atol=1e-8, msg=name)
    assert (run.teacher.copy is not None) and run.teacher.copy is not run.student_model


@pytest.mark.parametrize("every", [1, 2])
def test_the_ema_teacher_moves_toward_the_student_by_the_update_rate(tokenizer, tmp_path, every):
    run = distiller(tokenizer, tmp_path, teacher_model_kind="ema", teacher_update_rate=0.25, teacher_sync_steps=every,
                    max_steps=1)
    initial = {n: p.detach().clone() for n, p in run.teacher.copy.named_parameters()}
    run.setup()
    run.train_step(0, run._new_window(), {}, log_step=False)
    after_first = {n: p.detach().clone() for n, p in run.teacher.copy.named_parameters()}
    students = dict(run.student_model.named_parameters())
    for name, weight in after_first.items():
        if every == 1:  # theta_T = 0.75 theta_T + 0.25 theta_S: a quarter of the way to the student
            torch.testing.assert_close(weight, 0.75 * initial[name] + 0.25 * students[name].detach(), rtol=1e-6, atol=1e-7)
        else:  # not yet: the first update comes after the second step
            assert torch.equal(weight, initial[name]), name
    assert not torch.equal(students["model.embed_tokens.weight"].detach(), initial["model.embed_tokens.weight"])  # tied


def test_a_base_teacher_keeps_the_initial_weights(tokenizer, tmp_path):
    run = distiller(tokenizer, tmp_path, teacher_model_kind="base", max_steps=2)
    initial = student(tokenizer)
    run.train()
    for (name, teacher), (_, first) in zip(run.teacher.copy.named_parameters(), initial.named_parameters()):
        assert torch.equal(teacher, first), name
        assert not teacher.requires_grad
    assert not torch.equal(run.student_model.lm_head.weight, initial.lm_head.weight)


def test_a_lora_base_teacher_switches_the_adapter_off_without_a_copy(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", fixed_completions)
    run = distiller(tokenizer, tmp_path, teacher_model_kind="base", use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"],
                    learning_rate=0.1, max_steps=2)
    assert run.teacher.copy is None and run.teacher.adapter_off
    run.train()
    run.student_model.train()
    mb = run.rollout.take(2, {})[0]
    signal = run.teacher.score(mb, 1.0)
    assert run.student_model.training  # the teacher pass restores the mode
    base, positions = student(tokenizer).eval(), predicting_positions(mb.completion_mask)
    rows = [run.teacher.teacher_prompt(c.example)[0] + c.completion_ids for c in mb.completions]
    teacher_batch = collate([Completion(run.teacher.teacher_prompt(c.example)[0], c.completion_ids, "student") for c in mb.completions], "student", run.parts.pad_id)
    with torch.no_grad():
        expected = backbone_hidden(base, teacher_batch.input_ids, teacher_batch.attention_mask)[:, :-1][
            predicting_positions(teacher_batch.completion_mask)]
        adapted = backbone_hidden(run.student_model, teacher_batch.input_ids, teacher_batch.attention_mask)[:, :-1][
            predicting_positions(teacher_batch.completion_mask)]
    assert len(rows) == len(mb.completions) and positions.sum() == signal.hidden.shape[0]
    torch.testing.assert_close(signal.hidden, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(adapted, expected, atol=1e-4)  # the adapter did train: switching it off matters


def final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def test_a_resumed_run_equals_an_uninterrupted_one_ema_teacher_included(tokenizer, tmp_path):
    settings = dict(teacher_model_kind="ema", teacher_update_rate=0.5, max_steps=4, save_steps=2, save_total_limit=5,
                    learning_rate=3e-3)
    straight = distiller(tokenizer, tmp_path / "straight", **settings)
    straight.train()
    distiller(tokenizer, tmp_path / "cut", **{**settings, "max_steps": 2}).train()
    hooks = torch.load(tmp_path / "cut" / "run" / "checkpoints" / "step-000002" / "hooks.pt", weights_only=True)
    assert set(hooks) == {"ema_teacher"} and "model.embed_tokens.weight" in hooks["ema_teacher"]["weights"]
    resumed = distiller(tokenizer, None, config=resume_config(tmp_path / "cut" / "run", {"max_steps": 4}), resume=True)
    resumed.train()
    expected, actual = final_weights(tmp_path / "straight" / "run"), final_weights(tmp_path / "cut" / "run")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    for (name, a), (_, b) in zip(straight.teacher.copy.named_parameters(), resumed.teacher.copy.named_parameters()):
        assert torch.equal(a, b), name
    assert not torch.equal(straight.teacher.copy.lm_head.weight, student(tokenizer).lm_head.weight)


def test_rows_without_context_are_skipped_and_counted(tokenizer, tmp_path):
    rows = context_rows(8)
    for i in (0, 3, 5):
        rows[i]["privileged_context"] = None
    run = distiller(tokenizer, tmp_path, rows=rows, missing_privileged_context="skip", per_device_train_batch_size=8,
                    gradient_accumulation_steps=1, max_steps=1)
    run.setup()
    (mb,) = run.rollout.take(0, {})
    for c, mask in zip(mb.completions, mb.completion_mask):
        assert any(c.mask) == (c.example.privileged_context is not None and bool(c.completion_ids))
        assert mask.tolist()[len(c.prompt_ids):len(c.prompt_ids) + len(c.mask)] == list(c.mask)
    window = run._new_window()
    run.train_step(0, window, {}, log_step=True)
    assert window.reduce()["self_teacher/rows_without_context"] == pytest.approx(3 / 8)


def test_generate_from_teacher_samples_after_the_teacher_prompt(tokenizer, tmp_path, monkeypatch):
    import distill.teachers.self_teacher as self_teacher

    seen = []

    def spy(model, prompts, sampling, *args, **kwargs):
        seen.extend(prompts)
        return fixed_completions(model, prompts, sampling)

    monkeypatch.setattr(self_teacher, "generate_completions", spy)
    run = distiller(tokenizer, tmp_path, generate_from_teacher=True, teacher_model_kind="live", teacher_sampling_temperature=0.7,
                    max_steps=2)
    result = run.train()
    assert len(seen) == 2 * 4 and all("The answer is" in tokenizer.decode(ids) for ids in seen)
    assert result["train"]["micro_batches/teacher"] == 2 and "micro_batches/student" not in result["train"]
    assert run.rollout.settings.seq_kd_generation_steps == 1  # a moving teacher never samples ahead


# --------------------------------------------------------------------- processes, precision, seed 000 --
def _sdft_step(rank, world_size, tmp, batch, accumulation):
    from pathlib import Path

    import distill.training.student_sampler

    original, distill.training.student_sampler.generate_completions = distill.training.student_sampler.generate_completions, fixed_completions
    try:
        torch.manual_seed(0)
        tokenizer = train_tiny_tokenizer()
        config = config_for(Path(tmp) / f"rank{rank}", per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                            max_grad_norm=0.0, num_loss_tokens_to_skip=1, distillation_mode="topk_logits", distillation_topk=9)
        run = distiller(tokenizer, None, rows=context_rows(8), config=config)
        result = first_step_gradient(run)
        result["local_tokens"] = sum(mb.num_completion_tokens for mb in run.rollout.take(0, {}))
        return result
    finally:
        distill.training.student_sampler.generate_completions = original


@pytest.mark.slow
def test_gradient_and_metrics_are_split_invariant_across_processes_with_unequal_token_counts(tmp_path):
    """Seed 000: a logged mean is the global token-weighted mean (sum of numerators / sum of counts over
    processes in fp32), not a mean of per-process means, which would differ here."""
    single = _sdft_step(0, 1, str(tmp_path / "single"), 8, 1)
    ranks = run_in_processes(_sdft_step, world_size=2, args=(str(tmp_path / "multi"), 2, 2))
    assert ranks[0]["local_tokens"] != ranks[1]["local_tokens"]
    for rank in ranks:
        assert_same_gradients(rank["grads"], single["grads"])
    for key in ("loss", "forward_kl", "reverse_kl", "top1_agreement", "self_teacher/prompt_truncated"):
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5), key
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


def _bf16_run(rank, world_size, tmp):
    from pathlib import Path

    return distiller(train_tiny_tokenizer(), Path(tmp), dtype="bfloat16", max_steps=2).train()["train"]


def test_a_bf16_autocast_loss_stacks_with_fp32_counts(tmp_path):
    """Seed 000's crash: a low-precision loss sum next to float32 token counts in the metric reduction. In a
    fresh process: accelerate's precision is fixed once per process."""
    (result,) = run_in_processes(_bf16_run, world_size=1, args=(str(tmp_path),))
    assert torch.isfinite(torch.tensor([result["loss"], result["forward_kl"]])).all() and result["loss"] > 0
    from distill.training.metrics import MetricWindow

    window = MetricWindow()
    window.add_mean("loss", torch.tensor(3.0, dtype=torch.bfloat16), torch.tensor(2, dtype=torch.int64))
    window.add_mean("loss", torch.tensor(1.0, dtype=torch.float16), torch.tensor(2.0))
    assert window.reduce()["loss"] == 1.0


# -------------------------------------------------------------------------------------------- sft --
def test_sft_loss_is_the_mean_cross_entropy_of_the_completion_tokens(tokenizer, tmp_path):
    """One micro-batch per step: the logged loss is transformers' own labels loss on that micro-batch."""
    run = distiller(tokenizer, tmp_path, rows=chat_rows(8), config=config_for(tmp_path, base=SFT, per_device_train_batch_size=4,
                                                                               gradient_accumulation_steps=1))
    run.setup()
    (mb,) = run.rollout.take(0, {})
    labels = torch.where(mb.completion_mask, mb.input_ids, torch.full_like(mb.input_ids, -100))
    with torch.no_grad():
        expected = run.student_model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, labels=labels).loss
    window = run._new_window()
    run.train_step(0, window, {}, log_step=True)
    assert window.reduce()["loss"] == pytest.approx(float(expected), rel=1e-5)
    assert mb.source == "dataset"


# ------------------------------------------------------------------------------- eval and model card --
def answer_rows(n: int) -> list[dict]:
    rows = context_rows(n)
    for i, row in enumerate(rows):
        row.update(answer=f"number {i}", completion=f"The answer is number {i}.")
    return rows


@pytest.mark.parametrize("base", [SDFT, SFT])
def test_eval_before_after_and_distill_eval_use_the_initial_model_with_the_context(tokenizer, tmp_path, model_dirs, base):
    eval_file = tmp_path / "heldout.jsonl"
    eval_file.write_text("\n".join(json.dumps(r) for r in answer_rows(4)) + "\n")
    config = config_for(tmp_path, base=base, student=str(model_dirs["student"]), eval_before_after=True, eval_dataset=str(eval_file),
                        eval_split="train", eval_max_new_tokens=6, max_teacher_prompt_length=96)
    Distiller(config, train_dataset=datasets.Dataset.from_list(answer_rows(8))).train()
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    for name in ("before", "after"):
        assert report["metrics"][name]["answer_accuracy"]["prompts"] == 4
        assert report["metrics"][name]["on_teacher_completions"]["tokens"] > 0
        assert report["metrics"][name]["template_leakage"]["answers"] == 4  # every prompt's greedy answer is checked
    assert "Template leakage (greedy answers repeating 5 or more words" in (tmp_path / "run" / "eval" / "eval.md").read_text()
    assert (tmp_path / "run" / "plots" / "evaluation.png").is_file()
    # before training the student is the teacher's weights without the context: KL > 0 comes from the context alone
    assert report["metrics"]["before"]["on_teacher_completions"]["forward_kl"] > 0
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert ("arXiv:2601.19897" in card and "shenfeld2026selfdistillation" in card) == (base is SDFT)
    assert ("## Citation" in card) == (base is SDFT)
    assert main(["eval", str(tmp_path / "run"), "--max-new-tokens", "6"]) == 0
    cli = json.loads((tmp_path / "run" / "eval-cli" / "eval.json").read_text())
    assert cli["metrics"]["student"]["answer_accuracy"]["prompts"] == 4
    assert cli["metrics"]["student"]["on_teacher_completions"]["forward_kl"] == pytest.approx(
        report["metrics"]["after"]["on_teacher_completions"]["forward_kl"], rel=1e-4)


def test_distill_eval_of_an_sdft_run_refuses_a_teacher_server(tokenizer, tmp_path, model_dirs, capsys):
    config = config_for(tmp_path, student=str(model_dirs["student"]), max_steps=1)
    Distiller(config, train_dataset=datasets.Dataset.from_list(context_rows(8))).train()
    assert main(["eval", str(tmp_path / "run"), "--teacher-url", "http://127.0.0.1:9"]) == 2
    assert "is compared with its own initial model" in capsys.readouterr().err
