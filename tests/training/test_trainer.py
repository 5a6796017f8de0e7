"""The training loop on one process: sources, denominators, EOS, checkpoints, outputs, errors."""

import json

import datasets
import pytest
import torch

from distill.config import DistillConfig
from distill.methods.mixing import draw_sources
from distill.objectives import StepContext
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import FAST, make_config, make_distiller
from tests.skip_guard import needs_extra


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("lmbda", [0.0, 1.0])
def test_off_policy_and_on_policy_each_train_every_parameter(tokenizer, tmp_path, lmbda):
    distiller = make_distiller(tokenizer, tmp_path, lmbda=lmbda)
    before = snapshot(distiller.student_model)
    result = distiller.train()
    after = snapshot(distiller.student_model)
    assert before.keys() == after.keys()
    for name in before:
        assert not torch.equal(before[name], after[name]), f"{name} did not move"
    source = "student" if lmbda == 1.0 else "dataset"
    assert f"loss/{source}" in result["train"] and result["train"][f"micro_batches/{source}"] == 2


def _mixed_step(seed, accumulation):
    for step in range(100):
        if len(set(draw_sources(0.5, False, seed, step, accumulation))) == 2:
            return step
    raise AssertionError("no mixed step")


def test_loss_denominator_is_the_completion_tokens_of_the_whole_step(tokenizer, tmp_path):
    rows = [{**row, "completion": "ok " * (1 + i % 5)} for i, row in enumerate(chat_rows(16))]  # "" is refused
    distiller = make_distiller(tokenizer, tmp_path, rows=rows, lmbda=0.5, gradient_accumulation_steps=3, max_new_tokens=30)
    distiller.setup()
    step = _mixed_step(distiller.parts.config.seed, 3)
    rollouts, backward_losses = [], []
    original_rollout, original_backward = distiller.rollout.take, distiller.parts.accelerator.backward

    def recording_rollout(s, t):
        rollouts.extend(original_rollout(s, t))
        return rollouts

    def recording_backward(loss):
        backward_losses.append(loss.item())
        original_backward(loss)

    distiller.rollout.take, distiller.parts.accelerator.backward = recording_rollout, recording_backward
    distiller.train_step(step, distiller._new_window(), {}, log_step=False)

    assert {mb.source for mb in rollouts} == {"student", "dataset"}
    per_micro_batch = [int(mb.completion_mask.sum()) for mb in rollouts]
    assert len(set(per_micro_batch)) > 1  # unequal token counts: a mean of per-micro-batch means would differ
    trained_tokens = sum(per_micro_batch)
    # The same models before the step (same seeds) give each micro-batch's loss sum.
    fresh = make_distiller(tokenizer, tmp_path / "fresh", rows=rows, lmbda=0.5, gradient_accumulation_steps=3, max_new_tokens=30)
    fresh.setup()
    with torch.no_grad():
        for mb, recorded in zip(rollouts, backward_losses):
            signal = fresh.teacher.score(mb, 1.0)
            out = fresh.state.wrapped(mb, signal, fresh.parts.objective, StepContext(mb.source))
            assert int(out.num_tokens) == int(mb.completion_mask.sum())
            assert recorded == pytest.approx(out.loss_sum.item() / trained_tokens, rel=1e-5)


def test_a_step_without_trained_tokens_moves_neither_the_weights_nor_the_schedule(tokenizer, tmp_path):
    """Every completion empty (all masked): the optimizer is skipped, and so is the schedule (stepping it alone
    would desynchronise them: torch's 'lr_scheduler.step() before optimizer.step()'); the next step uses the
    learning rate the skipped one would have."""
    import warnings

    distiller = make_distiller(tokenizer, tmp_path, lmbda=0.0, lr_scheduler_type="linear", max_steps=4)
    distiller.setup()
    original_rollout = distiller.rollout.take

    def empty_rollout(step, timings):
        micro_batches = original_rollout(step, timings)
        for mb in micro_batches:
            mb.completion_mask[:] = False
        return micro_batches

    distiller.rollout.take = empty_rollout
    weights = {n: p.detach().clone() for n, p in distiller.student_model.named_parameters()}
    first_lr = distiller.state.scheduler.get_last_lr()[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's scheduler warning would fail the test
        distiller.train_step(0, distiller._new_window(), {}, log_step=False)
        assert distiller.state.scheduler.last_epoch == 0 and distiller.state.scheduler.get_last_lr()[0] == first_lr
        assert all(torch.equal(p.detach(), weights[n]) for n, p in distiller.student_model.named_parameters())
        distiller.rollout.take = original_rollout
        distiller.train_step(1, distiller._new_window(), {}, log_step=False)
    assert distiller.state.scheduler.last_epoch == 1
    assert any(not torch.equal(p.detach(), weights[n]) for n, p in distiller.student_model.named_parameters())


def _record_generate(distiller, log):
    from distill.training.student_sampler import generate_completions as original

    def recording(model, prompts, *args, **kwargs):
        who = "teacher" if model is distiller.teacher.model else "student"
        log.append((who, len(prompts)))
        return original(model, prompts, *args, **kwargs)

    return recording


def test_seq_kd_with_lmbda_1_never_calls_teacher_generation(tokenizer, tmp_path, monkeypatch):
    distiller = make_distiller(tokenizer, tmp_path, lmbda=1.0, seq_kd=True, rows=chat_rows(16, with_completion=False))
    calls = []
    recording = _record_generate(distiller, calls)  # made before patching: it wraps the real generate_completions
    for module in ("distill.training.student_sampler", "distill.teachers.local"):
        monkeypatch.setattr(f"{module}.generate_completions", recording)
    distiller.train()
    assert calls and all(who == "student" for who, _ in calls)


def _mixed_seq_kd(tokenizer, tmp_path, monkeypatch, max_steps, generation_steps):
    """A set-up seq_kd run mixing student and teacher micro-batches, and the list its generate calls go to."""
    distiller = make_distiller(tokenizer, tmp_path, lmbda=0.5, seq_kd=True, gradient_accumulation_steps=4, max_steps=max_steps,
                               rows=chat_rows(16, with_completion=False), seq_kd_generation_steps=generation_steps)
    calls = []
    recording = _record_generate(distiller, calls)  # made before patching: it wraps the real generate_completions
    for module in ("distill.training.student_sampler", "distill.teachers.local"):
        monkeypatch.setattr(f"{module}.generate_completions", recording)
    distiller.setup()
    return distiller, calls


def test_teacher_generates_once_per_step_and_only_for_its_micro_batches(tokenizer, tmp_path, monkeypatch):
    distiller, calls = _mixed_seq_kd(tokenizer, tmp_path, monkeypatch, max_steps=4, generation_steps=1)
    for step in range(4):
        calls.clear()
        distiller.train_step(step, distiller._new_window(), {}, log_step=False)
        sources = draw_sources(0.5, True, distiller.parts.config.seed, step, 4)
        teacher_calls = [n for who, n in calls if who == "teacher"]
        student_calls = [n for who, n in calls if who == "student"]
        assert teacher_calls == ([2 * sources.count("teacher")] if "teacher" in sources else [])
        assert student_calls == ([2 * sources.count("student")] if "student" in sources else [])


def test_teacher_samples_a_window_of_steps_in_one_call(tokenizer, tmp_path, monkeypatch):
    distiller, calls = _mixed_seq_kd(tokenizer, tmp_path, monkeypatch, max_steps=7, generation_steps=3)
    samples = {}  # step -> the teacher completions of its micro-batches
    for step in range(7):
        before = len(calls)
        batches = distiller.rollout.take(step, {})
        teacher_calls = [n for who, n in calls[before:] if who == "teacher"]
        first = step - step % 3
        expected_prompts = sum(2 * distiller.rollout.sources(s).count("teacher") for s in range(first, min(first + 3, 7)))
        assert teacher_calls == ([expected_prompts] if step == first and expected_prompts else [])
        samples[step] = [c.completion_ids for mb in batches if mb.source == "teacher" for c in mb.completions]
    # A fresh run resumed in the middle of a window regenerates exactly the same teacher samples.
    again = make_distiller(tokenizer, tmp_path / "again", lmbda=0.5, seq_kd=True, gradient_accumulation_steps=4, max_steps=7,
                           rows=chat_rows(16, with_completion=False), seq_kd_generation_steps=3)
    again.setup()
    torch.manual_seed(1234)  # a different global RNG must not matter
    resumed = [c.completion_ids for step in (4, 5) for mb in again.rollout.take(step, {}) if mb.source == "teacher" for c in mb.completions]
    assert samples[4] + samples[5], "no teacher micro-batch at steps 4-5: nothing to compare"
    assert resumed == samples[4] + samples[5]


class Scripted:
    """Replaces a model's generate: each row continues with tokens, then pads with EOS (pad == eos)."""

    def __init__(self, tokens):
        self.tokens = tokens

    def __call__(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **kwargs):
        row = (self.tokens + [pad_token_id] * max_new_tokens)[:max_new_tokens]
        return torch.cat([input_ids, torch.tensor([row] * input_ids.shape[0])], dim=1)


@pytest.mark.parametrize("source", ["student", "teacher", "dataset"])
def test_pad_equal_to_eos_keeps_the_terminating_eos_in_the_loss(tokenizer, tmp_path, source):
    eos = tokenizer.eos_token_id
    assert tokenizer.pad_token_id == eos
    lmbda, seq_kd = {"student": (1.0, False), "teacher": (0.0, True), "dataset": (0.0, False)}[source]
    rows = [{**row, "completion": "ok"} for row in chat_rows(16)]
    distiller = make_distiller(tokenizer, tmp_path, rows=rows, lmbda=lmbda, seq_kd=seq_kd, max_new_tokens=8, generation_engine="hf")
    distiller.student_model.generate = Scripted([5, 6, eos])
    distiller.teacher.model.generate = Scripted([7, eos])
    for mb in distiller.rollout.take(0, {}):
        assert mb.source == source
        for row, completion in enumerate(mb.completions):
            assert completion.completion_ids[-1] == eos
            positions = mb.completion_mask[row].nonzero().squeeze(1)
            assert len(positions) == len(completion.completion_ids)
            assert mb.input_ids[row, positions[-1]].item() == eos  # the EOS is a trained position
            assert mb.attention_mask[row, positions[-1]].item() == 1


def test_run_directory_final_model_card_and_metrics(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    eval_rows = datasets.Dataset.from_list(chat_rows(4, with_completion=False, seed=3))
    distiller = make_distiller(tokenizer, tmp_path, lmbda=0.5, eval_dataset=eval_rows, eval_before_after=True,
                               eval_max_new_tokens=5, eval_examples=2, save_steps=1)
    result = distiller.train()
    run = tmp_path / "run"
    loaded = AutoModelForCausalLM.from_pretrained(run / "model")
    for name, p in distiller.student_model.named_parameters():
        assert torch.equal(loaded.state_dict()[name], p.detach())
    assert AutoTokenizer.from_pretrained(run / "model").get_vocab() == tokenizer.get_vocab()
    card = (run / "model" / "README.md").read_text()
    assert "2306.13649" in card and "gkd" in card
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in ("loss", "forward_kl", "reverse_kl", "student_entropy", "teacher_entropy", "top1_agreement", "topk_overlap",
                "completion_length", "completion_length_max", "clipped_ratio", "learning_rate", "grad_norm",
                "tokens_per_second/teacher", "tokens_per_second/student", "prompts_truncated"):
        assert key in records[-1], key
    assert (run / "config.yaml").is_file() and (run / "plots" / "loss.png").is_file()
    report = json.loads((run / "eval" / "eval.json").read_text())
    assert set(report["metrics"]) == {"before", "after"} and len(report["examples"]) == 2
    assert (run / "eval" / "eval.md").read_text().startswith("# Evaluation")
    assert result["eval"]["after"]["on_teacher_completions"]["tokens"] > 0
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["step-000001", "step-000002"]


def test_ctrl_c_finishes_the_step_saves_a_checkpoint_and_resumes(tokenizer, tmp_path):
    import os
    import signal

    distiller = make_distiller(tokenizer, tmp_path, max_steps=5)
    original = distiller.train_step

    def interrupted_during_third(step, *args, **kwargs):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # arrives in the middle of the step
        return original(step, *args, **kwargs)

    distiller.train_step = interrupted_during_third
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the tests were started with SIGINT ignored (nohup)
    if before is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # this test is about a run that catches Ctrl-C
    try:
        with pytest.raises(KeyboardInterrupt):
            distiller.train()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored to what it was before the run
    finally:
        signal.signal(signal.SIGINT, before)
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-000003"]  # the interrupted step was completed, then saved

    from distill.rundir.directory import resume_config

    resumed = Distiller(resume_config(tmp_path / "run"), student=tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id),
                        teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id), tokenizer=tokenizer,
                        train_dataset=datasets.Dataset.from_list(chat_rows(16)), resume=True)
    assert resumed.train()["steps"] == 5


def test_a_run_started_with_sigint_ignored_keeps_ignoring_it_and_still_stops_on_sigterm(tokenizer, tmp_path):
    """nohup / a background job: Ctrl-C was ignored before the run and stays ignored during it (the run does
    not stop); SIGTERM still finishes the step, checkpoints and stops; both handlers are restored after."""
    import os
    import signal

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        distiller = make_distiller(tokenizer, tmp_path, max_steps=5)
        original, seen = distiller.train_step, []

        def signalled(step, *args, **kwargs):
            seen.append(signal.getsignal(signal.SIGINT))
            if step == 1:
                os.kill(os.getpid(), signal.SIGINT)  # ignored: the run goes on
            if step == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            return original(step, *args, **kwargs)

        distiller.train_step = signalled
        with pytest.raises(KeyboardInterrupt):
            distiller.train()
        assert seen == [signal.SIG_IGN] * 4
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
        assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-000004"]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_models_loaded_from_disk_train_in_training_mode(tokenizer, tmp_path, model_dirs):
    distiller = make_distiller(tokenizer, tmp_path, student=str(model_dirs["student"]))
    distiller.setup()
    assert distiller.student_model.training


def test_padded_embeddings_are_aligned_to_the_tokenizer(tokenizer, tmp_path):
    teacher = tiny_lm(len(tokenizer), layers=2, seed=3, eos_token_id=tokenizer.eos_token_id, pad_rows=13)
    distiller = make_distiller(tokenizer, tmp_path, teacher=teacher, teacher_tokenizer=tokenizer)
    assert distiller.parts.vocab_size == len(tokenizer)
    assert distiller.teacher.head.weight.shape[0] == len(tokenizer)
    distiller.train()


def test_truncated_prompts_are_counted(tokenizer, tmp_path):
    rows = [{"prompt": "word " * 80, "completion": "ok"} for _ in range(8)]
    result = make_distiller(tokenizer, tmp_path, rows=rows, lmbda=0.0, max_prompt_length=16).train()
    assert result["train"]["prompts_truncated"] == 4  # one step's 4 prompts in the last logging window


def test_lora_student_trains_its_adapters(tokenizer, tmp_path):
    needs_extra("peft", "peft")
    distiller = make_distiller(tokenizer, tmp_path, use_peft=True, lora_r=4, lora_alpha=8, lmbda=0.0)
    before = {n: p.detach().clone() for n, p in distiller.student_model.named_parameters() if p.requires_grad}
    distiller.train()
    after = dict(distiller.student_model.named_parameters())
    assert before and all("lora" in n for n in before)
    assert all(not torch.equal(before[n], after[n].detach()) for n in before if "lora_B" in n)
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")  # adapters merged: plain transformers loads it
    assert not (tmp_path / "run" / "model" / "adapter_config.json").exists()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, distiller.student_model(input_ids=ids).logits, rtol=1e-4, atol=1e-4)


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was validated")

    monkeypatch.setattr("distill.teachers.build.load_causal_lm", refuse)
    monkeypatch.setattr("distill.teachers.build.load_tokenizer", refuse)


@pytest.mark.parametrize(
    "dataset, overrides, error, match",
    [
        ([{"prompt": "hi", "completion": "x"}], {}, TypeError, "from_list"),
        ("dataframe", {}, TypeError, "from_pandas"),
        (datasets.Dataset.from_list([{"text": "hi"}]), {}, ValueError, "'prompt' column"),
        (datasets.Dataset.from_dict({"prompt": []}), {}, ValueError, "empty"),
        (datasets.Dataset.from_list([{"messages": [{"role": "user", "text": "x"}]}]), {}, ValueError, "malformed"),
        (None, {"method": "magic"}, ValueError, "method"),
        (None, {"beta": 3.0}, ValueError, "beta"),
        (None, {"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        (None, {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4}, ValueError, "per_device_train_batch_size"),
        (None, {"teacher": "/no/such/teacher"}, ValueError, "teacher: model path /no/such/teacher does not exist"),
        (datasets.Dataset.from_list([{"prompt": "hi"}] * 8), {"lmbda": 0.5}, ValueError, "seq_kd"),
    ],
)
def test_bad_input_fails_before_any_model_is_loaded(tmp_path, no_model_loading, dataset, overrides, error, match):
    if isinstance(dataset, str):
        import pandas  # a dependency of datasets
        dataset = pandas.DataFrame({"prompt": ["hi"]})
    dataset = datasets.Dataset.from_list(chat_rows(16)) if dataset is None else dataset
    values = {"teacher": "/no/such/teacher" if "teacher" in overrides else "smollm2-135m-instruct", **overrides}
    with pytest.raises(error, match=match):
        Distiller(make_config(tmp_path, **values), train_dataset=dataset)


def test_missing_tracker_is_reported_before_loading(tmp_path, no_model_loading, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ValueError, match="report_to: wandb is not installed"):
        Distiller(make_config(tmp_path, report_to="wandb"), train_dataset=datasets.Dataset.from_list(chat_rows(16)))


def _record_training_calls(module) -> list[bool]:
    """module.training at every call of its forward (replaced on the instance: transformers keeps module hooks out of the
    recomputation in backward)."""
    calls, forward = [], module.forward

    def recording(*args, **kwargs):
        calls.append(module.training)
        return forward(*args, **kwargs)

    module.forward = recording
    return calls


def test_gradient_checkpointing_trains(tokenizer, tmp_path):
    """On in the student (every layer runs again in backward), and training gives the weights it gives without it."""
    runs = {}
    for checkpointing in (False, True):
        distiller = make_distiller(tokenizer, tmp_path / f"checkpointing-{checkpointing}", gradient_checkpointing=checkpointing, lmbda=0.5,
                                   max_steps=1)
        layers = distiller.student_model.get_decoder().layers
        assert [layer.gradient_checkpointing for layer in layers] == [checkpointing] * len(layers)
        calls = _record_training_calls(layers[0].mlp)  # training mode: the loss's forwards and their recomputations, not sampling
        before = snapshot(distiller.student_model)
        distiller.train()
        runs[checkpointing] = before, snapshot(distiller.student_model), sum(calls)
    (before, plain, plain_forwards), (_, checkpointed, checkpointed_forwards) = runs[False], runs[True]
    assert checkpointed_forwards == 2 * plain_forwards > 0
    assert not torch.equal(before["model.embed_tokens.weight"], checkpointed["model.embed_tokens.weight"])
    for name, weight in checkpointed.items():
        torch.testing.assert_close(weight, plain[name], rtol=1e-4, atol=1e-6, msg=name)


def test_existing_output_dir_needs_overwrite(tmp_path, no_model_loading):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep.txt").write_text("precious")
    with pytest.raises(ValueError, match="overwrite_output_dir"):
        Distiller(make_config(tmp_path), train_dataset=datasets.Dataset.from_list(chat_rows(16)))
    assert (tmp_path / "run" / "keep.txt").read_text() == "precious"


def test_tokenizer_mismatch_names_cross_tokenizer_distillation(tokenizer, tmp_path):
    from tests.conftest import train_tiny_tokenizer

    other = train_tiny_tokenizer(vocab_size=300)
    teacher = tiny_lm(len(other), layers=2, seed=4, eos_token_id=other.eos_token_id)
    teacher.save_pretrained(tmp_path / "other-teacher")
    other.save_pretrained(tmp_path / "other-teacher")
    with pytest.raises(ValueError, match="cross-tokenizer"):
        make_distiller(tokenizer, tmp_path, teacher=str(tmp_path / "other-teacher"))


@pytest.mark.parametrize("kwargs, overrides, match", [
    ({"teacher_tokenizer": "tok"}, {"teacher_url": "http://127.0.0.1:9", "student": "s"}, "teacher_tokenizer: this run's teacher is teacher_url"),
    ({"teacher": "t"}, {"teacher_url": "http://127.0.0.1:9", "student": "s"}, "teacher: this run's teacher is teacher_url"),
    ({"eval_dataset": "bundled"}, {}, "eval_dataset: evaluation is off"),
])
def test_arguments_the_run_would_not_read_are_rejected(tmp_path, no_model_loading, kwargs, overrides, match):
    with pytest.raises(ValueError, match=match):
        Distiller(make_config(tmp_path, **overrides), train_dataset=datasets.Dataset.from_list(chat_rows(16)), **kwargs)


def test_overwrite_removes_only_what_a_run_wrote(tokenizer, tmp_path):
    make_distiller(tokenizer, tmp_path).train()
    run = tmp_path / "run"
    (run / "notes.txt").write_text("mine")
    (run / "data").mkdir()
    (run / "data" / "rows.jsonl").write_text("{}")
    stale = run / "checkpoints" / "step-000099"
    stale.mkdir()
    distiller = make_distiller(tokenizer, tmp_path, overwrite_output_dir=True)
    distiller.train()
    assert (run / "notes.txt").read_text() == "mine" and (run / "data" / "rows.jsonl").read_text() == "{}"
    assert not stale.exists()  # the previous run's checkpoints are gone, this run's are there
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002"]


@pytest.mark.parametrize("method", ["sft", "gkd"])
def test_a_student_named_in_the_config_keeps_all_its_layers(tokenizer, model_dirs, tmp_path, method):
    """student_init's default is 'all' for a student of its own, named by the argument or by `student` in the
    config (a recipe): only a student made from the teacher's weights drops layers (a refactor once read the
    argument alone, and a recipe's student lost every third layer)."""
    four_layers = str(model_dirs["teacher"])
    if method == "sft":  # no teacher, no mixing fields
        values = {k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}
    else:
        values = {**FAST, "teacher": four_layers}
    config = DistillConfig(**values, method=method, student=four_layers, output_dir=str(tmp_path / "run"))
    distiller = Distiller(config, train_dataset=datasets.Dataset.from_list(chat_rows(8)))
    assert distiller.student_model.config.num_hidden_layers == 4
