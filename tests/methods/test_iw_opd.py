"""method iw_opd end to end: config rules, teachers (model, server, routed), empty steps, rollout reuse,
split invariance over processes and micro-batches, kill/resume identity, eval and the model card."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import datasets
import pytest
import torch

from distill import DistillConfig
from distill.cli import main
from distill.generation.sample import Sample
from distill.losses import LogitHead
from distill.objectives.base import StudentTokens
from distill.objectives.sampled import teacher_token_log_probs
from distill.rundir.directory import resume_config
from distill.signals import DenseSignal, RoutedSignal, SparseSignal
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm, train_tiny_tokenizer
from tests.distributed import assert_same_gradients, first_step_gradient, run_in_processes
from tests.helpers.training import FAST
from tests.losses import reference

# FAST minus GKD's mixing fields, which iw_opd does not read (setting them is an error).
IW_OPD = {**{k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}, "method": "iw_opd"}


def iw_opd_config(tmp_path, **overrides) -> DistillConfig:
    return DistillConfig(**{**IW_OPD, "output_dir": str(tmp_path / "run"), **overrides})


def models(tokenizer):
    return dict(student=tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id),
                teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id))


def distiller(tokenizer, tmp_path, rows=None, resume=False, config=None, **overrides) -> Distiller:
    config = config or iw_opd_config(tmp_path, **overrides)
    return Distiller(config, tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(rows or chat_rows(16)),
                     resume=resume, **models(tokenizer))


@pytest.mark.parametrize("overrides, message", [
    ({"iw_opd_gamma": -0.1}, "iw_opd_gamma must be a finite number >= 0"),
    ({"iw_opd_epsilon": 0.0}, "iw_opd_epsilon must be a finite number > 0"),
    ({"num_iterations": 0}, "num_iterations must be a positive integer"),
    ({"num_iterations": 2, "epsilon_low": 1.0}, "epsilon_low / epsilon_high / dual_clip: clip bounds"),
    ({"num_iterations": 2, "epsilon_high": -0.5}, "epsilon_low / epsilon_high / dual_clip: clip bounds"),
    ({"num_iterations": 2, "dual_clip": 0.5}, "dual_clip must be > 1"),
    ({"epsilon_low": 0.1}, r"epsilon_low is only read with num_iterations > 1"),
    ({"teacher_warmup_steps": -1}, "teacher_warmup_steps must be >= 0"),
    ({"teacher_warmup_steps": 4, "seq_kd_generation_steps": 0}, "seq_kd_generation_steps must be a positive integer"),
    ({"lmbda": 0.3}, "lmbda is not read by method iw_opd"),
    ({"seq_kd": False}, "seq_kd is not read by method iw_opd"),
    ({"beta": 0.9}, "beta is not read by method iw_opd"),
    ({"teacher_cache": "some/cache", "student": "s"}, "teacher_cache: iw_opd learns from the student's own samples"),
    ({"sampling_temperature": 0.7}, r"sampling_temperature \(0.7\) and temperature \(1.0\) must be equal"),
    ({"top_p": 0.9}, r"top_p \(0.9\) and top_k \(0\): iw_opd .* needs samples from the student.s whole distribution"),
    ({"teacher_warmup_steps": 2, "teacher_url": "http://127.0.0.1:9", "student": "s"}, "teacher_warmup_steps needs a teacher model"),
])
def test_bad_iw_opd_settings_fail_before_any_model_loads(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        iw_opd_config(tmp_path, **overrides).validate()


def test_cli_rejects_gkd_fields_with_iw_opd(capsys):
    assert main(["train", "--method", "iw_opd", "--lmbda_schedule", "constant", "--student", "/no/such/model"]) == 2
    assert "lmbda_schedule is not read by method iw_opd" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ teachers --
def tokens_for(n: int, vocab: int = 13, hidden: int = 6, seed: int = 0) -> StudentTokens:
    generator = torch.Generator().manual_seed(seed)
    head = LogitHead(torch.randn(vocab, hidden, generator=generator), None)
    return StudentTokens(torch.randn(n, hidden, generator=generator), head, torch.randint(0, vocab, (n,), generator=generator),
                         torch.zeros(n, dtype=torch.long))


def test_teacher_log_probs_of_the_sampled_tokens_from_each_signal():
    tokens = tokens_for(9)
    generator = torch.Generator().manual_seed(1)
    teacher_head = LogitHead(torch.randn(13, 5, generator=generator), None)
    hidden = torch.randn(9, 5, generator=generator)
    exact = reference.probs(reference.head_logits(hidden, teacher_head.weight), 0.9)[torch.arange(9), tokens.targets].log()
    dense = teacher_token_log_probs(tokens, DenseSignal(hidden, teacher_head), 0.9, 4)
    torch.testing.assert_close(dense.double(), exact, rtol=1e-5, atol=1e-6)
    sampled = torch.randn(9, generator=generator) - 3
    sparse = SparseSignal(torch.zeros(9, 2, dtype=torch.long), torch.zeros(9, 2), sampled, None, 0.9)
    assert torch.equal(teacher_token_log_probs(tokens, sparse, 0.9, 4), sampled)
    first, second = torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6, 7, 8])
    routed = RoutedSignal([("a", first, DenseSignal(hidden[first], teacher_head)),
                           ("b", second, SparseSignal(torch.zeros(5, 2, dtype=torch.long), torch.zeros(5, 2), sampled[second], None, 0.9))])
    expected = torch.cat([dense[first], sampled[second]])
    torch.testing.assert_close(teacher_token_log_probs(tokens, routed, 0.9, 4), expected)


@pytest.mark.parametrize("make, message", [
    (lambda s: SparseSignal(torch.zeros(9, 2, dtype=torch.long), torch.zeros(9, 2), None, None, 1.0), "gives only its top-k"),
    (lambda s: SparseSignal(torch.zeros(9, 2, dtype=torch.long), torch.zeros(9, 2), s, None, 1.0), "no finite log-prob for 1 of 9"),
    (lambda s: SparseSignal(torch.zeros(8, 2, dtype=torch.long), torch.zeros(8, 2), s[:8], None, 1.0), r"scored \(8,\) positions"),
    (lambda s: SparseSignal(torch.zeros(9, 2, dtype=torch.long), torch.zeros(9, 2), s, None, 0.5), "at temperature 0.5"),
    (lambda s: RoutedSignal([("a", torch.tensor([0, 1]), SparseSignal(torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, 2),
                                                                        torch.zeros(2), None, 1.0))]), "no finite log-prob for 7 of 9"),
])
def test_a_teacher_that_misses_positions_is_an_error(make, message):
    sampled = torch.zeros(9)
    sampled[4] = float("-inf")
    with pytest.raises(ValueError, match=message):
        teacher_token_log_probs(tokens_for(9), make(sampled), 1.0, 4)


def test_trains_with_a_server_teacher(tokenizer, tmp_path, model_dirs):
    from tests.teachers.servers import serve_teacher

    with serve_teacher(model_dirs["teacher"]) as (url, _):
        config = iw_opd_config(tmp_path, teacher_url=url, student=str(model_dirs["student"]), max_steps=2, logging_steps=1)
        result = Distiller(config, train_dataset=datasets.Dataset.from_list(chat_rows(16))).train()
    assert result["steps"] == 2
    assert result["train"]["micro_batches/student"] == 2 and 0 < result["train"]["iw_opd/abs_advantage"] < 50


def test_fresh_rollouts_have_ratio_one_whatever_the_recorded_log_probs():
    """Generation may run in another precision than training (fp32 vs bf16 autocast): on a fresh rollout (with
    num_iterations 1, and on the first step of each reuse window with num_iterations > 1) the ratio is 1 by
    definition and no clip engages; the recorded log-probs still set the advantage. Only a later step of a
    reuse window compares with them."""
    from distill.objectives.base import StepContext
    from distill.objectives.iw_opd import IWOPDObjective, IWOPDSettings

    tokens = tokens_for(9)
    recorded = torch.full((9,), -1.0)
    tokens.rollout_log_probs = recorded + torch.linspace(-0.5, 0.5, 9)  # off by up to 0.5 nats: would be clipped
    teacher = SparseSignal(torch.zeros(9, 2, dtype=torch.long), torch.zeros(9, 2), torch.full((9,), -2.0), None, 1.0)
    for reused, fresh, expect_clipped in ((False, True, False), (True, True, False), (True, False, True)):
        out = IWOPDObjective(IWOPDSettings(reused_rollouts=reused))(tokens, teacher, StepContext("student", staleness=0 if fresh else 1))
        ratio_sum, count = out.metrics["iw_opd/ratio"]
        clipped_sum, _ = out.metrics["iw_opd/clip_fraction"]
        assert (float(ratio_sum) == float(count)) is not expect_clipped
        assert (float(clipped_sum) > 0) is expect_clipped
        advantage_sum, _ = out.metrics["iw_opd/advantage"]
        assert float(advantage_sum) == pytest.approx(float((-2.0 - tokens.rollout_log_probs).sum()), rel=1e-6)


def test_each_reused_rollout_takes_the_next_batch_of_prompts(tokenizer, tmp_path):
    run = distiller(tokenizer, tmp_path, max_steps=4, num_iterations=2)
    schedule = run.rollout.schedule
    sampler = schedule.sampler
    assert schedule.prompt_groups(0) == schedule.prompt_groups(1) == sampler.micro_batch_indices(0)
    assert schedule.prompt_groups(2) == schedule.prompt_groups(3) == sampler.micro_batch_indices(1)
    assert [run.rollout.generations(s) for s in (0, 1, 2, 3, 4)] == [0, 1, 1, 2, 2]


# ------------------------------------------------------------------------------------------ training --
def test_a_run_with_warmup_and_reuse_logs_its_metrics_and_cites_the_paper(tokenizer, tmp_path):
    result = distiller(tokenizer, tmp_path, max_steps=4, teacher_warmup_steps=2, num_iterations=2, logging_steps=1).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("micro_batches/teacher", 0) for r in records] == [2, 2, 0, 0]
    assert all("iw_opd/weight" not in r for r in records[:2])  # the warm-up phase is forward KL on teacher samples
    for r in records[2:]:
        assert 1.0 <= r["iw_opd/weight_min"] <= r["iw_opd/weight"] <= r["iw_opd/weight_max"] <= 1.5
        assert r["iw_opd/abs_advantage"] >= abs(r["iw_opd/advantage"])
        assert "forward_kl" in r and "reverse_kl" in r
    assert records[2]["iw_opd/ratio"] == pytest.approx(1.0, abs=1e-4)  # fresh rollout: pi_old is the student
    assert records[2]["iw_opd/clip_fraction"] == 0.0
    assert records[3]["iw_opd/ratio"] != pytest.approx(1.0, abs=1e-4)  # the reused rollout after one update
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "arXiv:2606.22600" in card and "@article{xie2026position" in card and "IW-OPD, gamma 0.5" in card
    assert result["steps"] == 4


def test_a_prompt_only_dataset_trains_through_warm_up_and_on_policy(tokenizer, tmp_path):
    rows = chat_rows(16, with_completion=False)
    result = distiller(tokenizer, tmp_path, rows=rows, max_steps=2, teacher_warmup_steps=1, logging_steps=1).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [sorted(k for k in r if k.startswith("micro_batches/")) for r in records] == [["micro_batches/teacher"],
                                                                                         ["micro_batches/student"]]
    assert result["steps"] == 2 and all(torch.isfinite(torch.tensor(r["loss"])) for r in records)


def test_a_step_of_empty_completions_trains_nothing_and_stays_finite(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions",
                        lambda model, prompts, *args, **kwargs: [Sample([], False, []) for _ in prompts])
    run = distiller(tokenizer, tmp_path, max_steps=1)
    before = {n: p.detach().clone() for n, p in run.student_model.named_parameters()}
    run.setup()
    batches = run.rollout.take(0, {})
    assert all(mb.input_ids.dtype == torch.long and mb.num_completion_tokens == 0 for mb in batches)
    result = run.train()
    assert result["train"].get("loss", 0.0) == 0.0  # no token: no loss to average (never +-inf or NaN)
    assert all(torch.equal(before[n], p) for n, p in run.student_model.named_parameters())


def fixed_completions(model, prompts, sampling, *args, **kwargs):
    """Deterministic "samples" (a function of the prompt), without log-probs: pi_old is recomputed."""
    return [Sample([5 + (p * 7) % 40 for p in prompt[-(2 + len(prompt) % 9):]]) for prompt in prompts]


def _iw_opd_step_gradient(rank, world_size, tmp, batch, accumulation, fsdp=False):
    from pathlib import Path

    import distill.training.student_sampler

    original, distill.training.student_sampler.generate_completions = distill.training.student_sampler.generate_completions, fixed_completions
    try:  # restored: the single-process call runs inside the test process
        torch.manual_seed(0)
        tokenizer = train_tiny_tokenizer()
        config = iw_opd_config(Path(tmp) / f"rank{rank}", per_device_train_batch_size=batch,
                               gradient_accumulation_steps=accumulation, max_grad_norm=0.0, fsdp=fsdp)
        return first_step_gradient(distiller(tokenizer, None, rows=chat_rows(8), config=config))
    finally:
        distill.training.student_sampler.generate_completions = original


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_gradient_is_split_invariant_across_processes_and_micro_batches(tmp_path, fsdp):
    single = _iw_opd_step_gradient(0, 1, str(tmp_path / "single"), 8, 1)
    ranks = run_in_processes(_iw_opd_step_gradient, world_size=2, args=(str(tmp_path / "multi"), 2, 2, fsdp))
    for rank in ranks:
        assert_same_gradients(rank["grads"], single["grads"])
    for key in ("loss", "iw_opd/advantage", "iw_opd/abs_advantage", "iw_opd/weight", "iw_opd/weight_min",
                "iw_opd/weight_max", "iw_opd/ratio"):
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5), key
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


def test_killed_inside_a_reuse_window_and_resumed_matches_an_uninterrupted_run(tokenizer, tmp_path):
    settings = dict(max_steps=6, num_iterations=3, teacher_warmup_steps=2, save_steps=1, save_total_limit=10, learning_rate=3e-3)
    straight = distiller(tokenizer, tmp_path / "straight", **settings)
    straight.train()

    cut = distiller(tokenizer, tmp_path / "cut", **settings)
    original = cut.train_step

    def interrupted_in_the_fifth(step, *args, **kwargs):
        if step == 4:  # step 3 generated the window [3, 4, 5]; the checkpoint after step 4 is inside it
            os.kill(os.getpid(), signal.SIGINT)
        return original(step, *args, **kwargs)

    cut.train_step = interrupted_in_the_fifth
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the tests were started in the background (nohup, &)
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # this test is about a run that catches Ctrl-C
        with pytest.raises(KeyboardInterrupt):
            cut.train()
    finally:
        signal.signal(signal.SIGINT, before)
    hooks = torch.load(tmp_path / "cut" / "run" / "checkpoints" / "step-000005" / "hooks.pt", weights_only=True)
    assert hooks["rollout"]["step"] == 3 and len(hooks["rollout"]["batches"]) == 2
    distiller(tokenizer, None, resume=True, config=resume_config(tmp_path / "cut" / "run")).train()
    expected, actual = _final_weights(tmp_path / "straight" / "run"), _final_weights(tmp_path / "cut" / "run")
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    straight_log = (tmp_path / "straight" / "run" / "metrics.jsonl").read_text().splitlines()
    cut_log = (tmp_path / "cut" / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in cut_log] == [1, 2, 3, 4, 5, 6]
    for mine, theirs in zip(cut_log, straight_log):
        a, b = json.loads(mine), json.loads(theirs)
        assert a["loss"] == b["loss"] and a.get("iw_opd/ratio") == b.get("iw_opd/ratio")


def _final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def test_distill_eval_works_on_an_iw_opd_run(tokenizer, tmp_path, model_dirs, capsys):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    assert main(["train", "--method", "iw_opd", "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]),
                 "--dataset", str(data), "--output_dir", str(tmp_path / "run"), "--max_steps", "2", "--max_new_tokens", "6",
                 "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1", "--eval_before_after", "false",
                 "--progress_bar", "false", "--save_steps", "0"]) == 0
    assert main(["eval", str(tmp_path / "run"), "--dataset", str(data), "--split", "train", "--max-prompts", "4",
                 "--max-new-tokens", "6", "--device", "cpu"]) == 0
    report = json.loads((tmp_path / "run" / "eval-cli" / "eval.json").read_text())
    assert report["metrics"]["student"]["on_student_completions"]["tokens"] > 0


# ------------------------------------------------------------------------------ the rollout producer --
def test_completions_record_the_weights_that_sampled_them_and_reuse_is_staleness(tokenizer, tmp_path):
    """A rollout's student completions carry the version (optimizer steps applied) they were sampled at; each
    step's objective sees the staleness of its micro-batch: 0 on a reuse window's first step, 1 on the next;
    the teacher's warm-up samples have no version and staleness 0."""
    run = distiller(tokenizer, tmp_path, max_steps=6, teacher_warmup_steps=2, num_iterations=2, logging_steps=1)
    seen = []
    original = run.parts.objective.__call__

    class Recording:
        signals = run.parts.objective.signals

        def __call__(self, tokens, signal, context):
            seen.append((context.source, context.staleness))
            return original(tokens, signal, context)

    run.parts = dataclasses.replace(run.parts, objective=Recording())
    taken = []
    take = run.rollout.take

    def recording_take(step, timings):
        batches = take(step, timings)
        taken.append((step, [c.weights_version for mb in batches for c in mb.completions]))
        return batches

    run.rollout.take = recording_take
    run.train()
    versions = dict(taken)
    assert all(v is None for v in versions[0] + versions[1])  # warm-up: teacher samples
    assert set(versions[2]) == set(versions[3]) == {2} and set(versions[4]) == set(versions[5]) == {4}
    per_step = [seen[i : i + 2] for i in range(0, len(seen), 2)]  # 2 micro-batches per step
    assert [sorted(set(s)) for s in per_step] == [[("teacher", 0)], [("teacher", 0)], [("student", 0)], [("student", 1)],
                                                  [("student", 0)], [("student", 1)]]


def test_a_reused_rollout_restored_from_a_checkpoint_keeps_its_versions(tokenizer, tmp_path):
    run = distiller(tokenizer, tmp_path, max_steps=4, num_iterations=2)
    run.setup()
    first = run.rollout.take(2, {})
    state = run.rollout.state_dict()
    assert {c["version"] for mb in state["batches"] for c in mb} == {2}
    again = distiller(tokenizer, tmp_path / "again", max_steps=4, num_iterations=2)
    again.rollout.load_state_dict(state)
    restored = again.rollout.take(3, {})
    assert [c.weights_version for mb in restored for c in mb.completions] == [c.weights_version for mb in first for c in mb.completions]
    assert all(mb.staleness(3) == 1 for mb in restored)
    for saved in state["batches"]:  # a checkpoint from before versions were recorded: the rollout's own step
        for c in saved:
            del c["version"]
    again.rollout.load_state_dict(state)
    assert {c.weights_version for mb in again.rollout.take(3, {}) for c in mb.completions} == {2}
