"""method sdpo end to end (and GRPO, its distillation_weight 0): reward functions, groups and advantages,
demonstration mining and reprompts, the combined loss, config and data rules, split invariance with groups
spread over processes, kill/resume, a failing reward function, warnings, model cards."""

from __future__ import annotations

import logging

import datasets
import pytest
import torch

from distill import DistillConfig
from distill.errors import RewardFunctionError
from distill.generation.sample import Sample
from distill.methods.sdpo.reprompts import (
    DEFAULT_FEEDBACK_TEMPLATE,
    DEFAULT_REPROMPT_TEMPLATE,
    DEFAULT_SOLUTION_TEMPLATE,
    Reprompts,
)
from distill.methods.sdpo.rewards import Rewards, load_reward_function, weighted_range
from distill.methods.sdpo.stage import ADVANTAGE, demonstration_rows, group_advantages
from distill.rundir.directory import resume_config
from distill.teachers.self_teacher import DISTILLED, TEACHER_PROMPT
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm, train_tiny_tokenizer
from tests.distributed import (
    assert_same_gradients,
    capture_at_optimizer_step,
    first_step_gradient,
    run_in_processes,
)
from tests.helpers.training import FAST, forbid_model_loading

ODD = "tests.methods.sdpo_rewards:odd_length"
SDPO = {**{k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}, "method": "sdpo",
        "num_generations": 2, "reward_funcs": [ODD]}
DISTILLING = {"max_reprompt_length": 96}  # the tiny models' 512-token context


def answer_rows(n: int) -> list[dict]:
    rows = chat_rows(n)
    for i, row in enumerate(rows):
        row.update(answer=str(i), id=i, parity=i % 2)
    return rows


def config_for(tmp_path, **overrides) -> DistillConfig:
    values = {**SDPO, "output_dir": str(tmp_path / "run"), **overrides}
    if values.get("distillation_weight", 1.0) > 0:
        values = {**DISTILLING, **values}
    return DistillConfig(**values)


def student(tokenizer):
    return tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)


def distiller(tokenizer, tmp_path, rows=None, config=None, resume=False, **overrides) -> Distiller:
    config = config or config_for(tmp_path, **overrides)
    return Distiller(config, student=student(tokenizer), tokenizer=tokenizer, resume=resume,
                     train_dataset=datasets.Dataset.from_list(rows if rows is not None else answer_rows(16)))


def group_completions(rows_per_process: int):
    """Deterministic "samples" that differ within a group: a function of the prompt and of the row's place
    in the step's global order (the process's offset + its place in this process's call), so that every
    split of the step into processes and micro-batches gets the same completions."""
    import torch.distributed as dist

    def generate(model, prompts, sampling, *args, with_log_probs=False, **kwargs):
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        out = []
        for place, prompt in enumerate(prompts):
            row = rank * rows_per_process + place
            ids = [5 + (p * 7 + row) % 40 for p in prompt[-(1 + (len(prompt) + row) % 5):]]
            out.append(Sample(ids, False, [-1.0] * len(ids) if with_log_probs else None))
        return out

    return generate


# ---------------------------------------------------------------------------- rewards and groups --
def test_builtin_rewards_check_the_answer_as_whole_words_and_the_regex():
    rows = [{"answer": "12"}, {"answer": "12"}, {"answer": "Paris"}]
    completions = ["It is 12.", "123", " paris "]
    contains = load_reward_function("contains_answer").function(["q"] * 3, completions, rows)
    equals = load_reward_function("equals_answer").function(["q"] * 3, completions, rows)
    regex = load_reward_function("regex", r"^\d+$").function(["q"] * 3, completions, rows)
    assert contains == [1.0, 0.0, 1.0] and equals == [0.0, 0.0, 1.0] and regex == [0.0, 1.0, 0.0]


def test_weighted_rewards_sum_per_function_values_and_know_their_range():
    rewards = Rewards([load_reward_function("contains_answer"), load_reward_function(ODD)], [2.0, -0.5])
    values = rewards(["q", "q"], ["a 1", "ab"], [{"answer": "1"}, {"answer": "1"}], [0, 1])
    assert values.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    assert rewards.total(values).tolist() == [1.5, 0.0]
    assert weighted_range(rewards.functions, rewards.weights) == (-0.5, 2.0)
    graded = load_reward_function("tests.methods.sdpo_rewards:length_score")
    assert graded.value_range is None and weighted_range([graded], [1.0]) is None


def test_user_functions_receive_prompts_completions_and_every_dataset_column():
    f = load_reward_function("tests.methods.sdpo_rewards:uses_prompts_and_rows")
    assert Rewards([f], [1.0])([[{"role": "user", "content": "q"}], "q"], ["ab", "abc"],
                               [{"parity": 0}, {"parity": 0}], [0, 1]).tolist() == [[1.0], [0.0]]


@pytest.mark.parametrize("name, message", [
    ("wrong_length", r"reward function tests.methods.sdpo_rewards:wrong_length returned 3 values for 2 completions"),
    ("not_finite", r"reward function tests.methods.sdpo_rewards:not_finite returned nan for dataset row 4"),
    ("raises_on_row_5", r"reward function tests.methods.sdpo_rewards:raises_on_row_5 raised on dataset row 5 .*KeyError"),
])
def test_a_bad_reward_function_is_an_error_naming_it_and_the_row(name, message):
    rewards = Rewards([load_reward_function(f"tests.methods.sdpo_rewards:{name}")], [1.0])
    with pytest.raises(RewardFunctionError, match=message):
        rewards(["q", "q"], ["a", "b"], [{"id": 4}, {"id": 5}], [4, 5])


def naive_advantages(rewards: list[float], size: int, scaling: str) -> list[float]:
    out = []
    every = torch.tensor(rewards, dtype=torch.float64)
    for start in range(0, len(rewards), size):
        group = every[start : start + size]
        mean = sum(group.tolist()) / size
        std = (sum((r - mean) ** 2 for r in group.tolist()) / (size - 1)) ** 0.5
        scale = {"group": std + 1e-4, "batch": float(every.std()) + 1e-4, "none": 1.0}[scaling]
        out += [(r - mean) / scale for r in group.tolist()]
    return out


@pytest.mark.parametrize("scaling", ["group", "batch", "none"])
def test_group_advantages_follow_the_definition(scaling):
    rewards = [1.0, 0.0, 0.0, 0.5, 2.0, 2.0, 2.0, 2.0]
    actual = group_advantages(torch.tensor(rewards), 4, scaling)
    assert actual.tolist() == pytest.approx(naive_advantages(rewards, 4, scaling), rel=1e-12)
    assert actual[4:].abs().max() == 0  # a group whose rewards are all equal has no advantage


def test_demonstrations_are_the_first_successful_sibling_in_the_group():
    rewards = torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    assert demonstration_rows(rewards, 4, 1.0, from_self=False) == [1, 3, 1, 1, 6, 6, None, 6]
    assert demonstration_rows(rewards, 4, 1.0, from_self=True) == [1, 1, 1, 1, 6, 6, 6, 6]
    assert demonstration_rows(rewards, 4, 2.0, from_self=True) == [None] * 8


def test_reprompts_fill_the_last_user_turn_and_leave_absent_blocks_empty(tokenizer):
    from distill.data import Example
    from distill.rendering import TextRenderer

    encoder = TextRenderer(tokenizer, 400, 8, [tokenizer.eos_token_id])
    reprompts = Reprompts(encoder, DEFAULT_REPROMPT_TEMPLATE, DEFAULT_SOLUTION_TEMPLATE, DEFAULT_FEEDBACK_TEMPLATE)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    example = Example(0, chat, None)
    both = reprompts.text(example, "5", "You wrote 6.")
    assert both[0] == chat[0] and both[1]["content"] == (
        "What is 2 + 3?\nCorrect solution:\n\n5\n\n\nThe following is feedback from your unsuccessful earlier "
        "attempt:\n\nYou wrote 6.\n\n\n\nCorrectly solve the original question.\n")
    assert reprompts.text(example, None, "x")[1]["content"].startswith("What is 2 + 3?\nThe following is feedback")
    assert reprompts.text(Example(0, "Q?", None), "A", None) == "Q?\nCorrect solution:\n\nA\n\n\n\nCorrectly solve the original question.\n"
    short = Reprompts(TextRenderer(tokenizer, 12, 8, [tokenizer.eos_token_id]), DEFAULT_REPROMPT_TEMPLATE,
                      DEFAULT_SOLUTION_TEMPLATE, DEFAULT_FEEDBACK_TEMPLATE)
    ids, cut, _ = short.ids(example, "5 " * 40, None)
    assert cut and len(ids) == 12 and ids == reprompts.ids(example, "5 " * 40, None)[0][-12:]


# ------------------------------------------------------------------------------------ bad input --
@pytest.mark.parametrize("overrides, message", [
    ({"num_generations": 1}, "num_generations must be >= 2"),
    ({"success_reward_threshold": 1.5}, r"success_reward_threshold 1.5 is outside the reward range \(0, 1\].*no rollout could succeed"),
    ({"success_reward_threshold": 0.0}, r"outside the reward range \(0, 1\].*every rollout would succeed"),
    ({"reward_funcs": ["no_such_module_xyz:f"]}, "reward_funcs: cannot import 'no_such_module_xyz'"),
    ({"reward_funcs": ["tests.methods.sdpo_rewards:missing"]}, "has no callable 'missing'"),
    ({"reward_funcs": ["contains"]}, "neither a built-in .* nor an import path"),
    ({"reward_funcs": []}, "reward_funcs is empty"),
    ({"reward_funcs": ["regex"]}, "reward_regex is empty"),
    ({"reward_funcs": ["regex"], "reward_regex": "("}, "reward_regex '\\(' is not a valid regular expression"),
    ({"reward_weights": [1.0, 2.0]}, "reward_weights has 2 values for 1 reward_funcs"),
    ({"reprompt_template": "{prompt}{solution}"}, r"reprompt_template must contain \{feedback\}"),
    ({"solution_template": "{solution}"}, r"solution_template has the placeholder \{solution\}"),
    ({"loss_type": "ppo", "distillation_weight": 0.5}, "loss_type must be one of"),
    ({"distillation_weight": 1.5}, r"distillation_weight must be in \[0, 1\]"),
    ({"advantage_scaling": "rank"}, "advantage_scaling must be one of"),
    ({"advantage_scaling": "batch"}, "advantage_scaling is only read with distillation_weight < 1"),
    ({"distillation_mode": "full_logits", "beta": None}, None),  # beta 1 by default for sdpo: valid
    ({"distillation_mode": "sampled_token", "beta": 0.5}, "sampled_token estimates reverse KL on the sampled token only"),
    ({"teacher_update_rate": 0.0}, r"teacher_update_rate must be in \(0, 1\]"),
    ({"teacher": "some/model"}, "teacher: method sdpo takes no teacher model"),
    ({"teacher_url": "http://127.0.0.1:9"}, "teacher_url: method sdpo takes no external teacher"),
    ({"loss_type": "grpo"}, "loss_type is only read with distillation_weight < 1"),
    ({"distillation_weight": 0.0, "teacher_model_kind": "base"}, "teacher_model_kind is only read with distillation_weight > 0"),
    ({"distillation_weight": 0.5, "sampling_temperature": 0.7}, "sampling_temperature .* and temperature .* must be equal"),
    ({"feedback_only_without_solution": True}, "feedback_only_without_solution is only read with distillation_weight > 0 with include_feedback"),
    ({"lmbda": 0.3}, "lmbda is not read by method sdpo"),
])
def test_bad_sdpo_settings_fail_before_any_model_loads(tmp_path, overrides, message):
    config = config_for(tmp_path, **overrides)
    if message is None:
        assert config.validate().beta == 1.0
        return
    with pytest.raises(ValueError, match=message):
        config.validate()


@pytest.mark.parametrize("rows, overrides, message", [
    (chat_rows(8), {"reward_funcs": ["contains_answer"]}, r"dataset row 0 has no 'answer' \(8 of 8 rows lack one\), which reward function contains_answer checks"),
    (answer_rows(8), {"include_feedback": True}, "include_feedback: no dataset row has a 'feedback'"),
    (answer_rows(8), {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 1, "num_generations": 2},
     r"= 3 completions per step is not a multiple of num_generations \(2\)"),
    ([{**row, "prompt": row["prompt"] + [{"role": "assistant", "content": "7"}]} if i == 5 else row
      for i, row in enumerate(answer_rows(8))], {},
     r"dataset row 5: the chat prompt ends with a 'assistant' turn after its last user turn"),
])
def test_dataset_and_batch_problems_fail_before_any_model_loads(tmp_path, model_dirs, monkeypatch, rows, overrides, message):
    forbid_model_loading(monkeypatch)
    config = config_for(tmp_path, student=str(model_dirs["student"]), **overrides)
    with pytest.raises(ValueError, match=message):
        Distiller(config, train_dataset=datasets.Dataset.from_list(rows))


# ------------------------------------------------------------------------------------- training --
def test_grpo_builds_no_self_teacher_and_trains_on_advantages(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", group_completions(8))
    run = distiller(tokenizer, tmp_path, distillation_weight=0.0, per_device_train_batch_size=4,
                    gradient_accumulation_steps=2, num_generations=4)
    assert run.teacher is None and run.parts.sampler.prompts_per_step == 2
    before = {n: p.detach().clone() for n, p in run.student_model.named_parameters()}
    result = run.train()["train"]
    after = dict(run.student_model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert result["sdpo/distillation_loss"] == 0.0 and result["sdpo/reprompt_sample_fraction"] == 0.0
    assert 0.0 <= result["reward/mean"] <= 1.0 and "reward/std" in result and "forward_kl" not in result
    groups = run.parts.sampler.micro_batch_indices(0)
    flat = [i for mb in groups for i in mb]
    assert flat[:4] == [flat[0]] * 4 and flat[4:] == [flat[4]] * 4  # a group spans both micro-batches
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "GRPO" in card and "2601.20802" in card


def test_failed_rollouts_are_distilled_toward_the_teacher_shown_a_successful_sibling(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", group_completions(8))
    run = distiller(tokenizer, tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4)
    run.setup()
    micro_batches = run.rollout.take(0, {})
    completions = [c for mb in micro_batches for c in mb.completions]
    texts = [tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in completions]
    success = [len(t) % 2 == 1 for t in texts]
    for i, c in enumerate(completions):
        group = range(i - i % 4, i - i % 4 + 4)
        sibling = next((j for j in group if success[j] and j != i), None)
        assert DISTILLED.of(c) == (sibling is not None)
        if sibling is not None:
            expected = run.rollout.parts.stage.stage.reprompts.ids(c.example, texts[sibling], None)
            assert TEACHER_PROMPT.of(c) == expected and texts[sibling] in tokenizer.decode(TEACHER_PROMPT.of(c)[0])
        assert ADVANTAGE.of(c) == pytest.approx(naive_advantages([float(s) for s in success], 4, "group")[i], rel=1e-6)
    assert torch.equal(micro_batches[0].advantages, torch.tensor([ADVANTAGE.of(c) for c in completions[:4]], dtype=torch.float32))
    signal = run.teacher.score(micro_batches[0], 1.0)
    lengths = [len(c.completion_ids) for c in micro_batches[0].completions]
    expected_mask = torch.tensor([DISTILLED.of(c) for c in micro_batches[0].completions]).repeat_interleave(torch.tensor(lengths))
    assert torch.equal(signal.distilled if signal.distilled is not None else torch.ones_like(expected_mask), expected_mask)
    assert signal.hidden[~expected_mask].abs().sum() == 0 and signal.hidden[expected_mask].abs().sum() > 0


def test_rows_without_a_demonstration_get_no_distillation_gradient(tokenizer, tmp_path, monkeypatch):
    """w = 1 with no success anywhere: no distillation loss, a zero gradient (the denominator still counts
    the tokens), and a warning that nothing succeeded."""
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", group_completions(4))
    run = distiller(tokenizer, tmp_path, reward_funcs=["contains_answer"])  # random tokens never hold the answer
    run.setup()
    window = run._new_window()
    captured = {}
    capture_at_optimizer_step(run, lambda: captured.update({n: p.grad for n, p in run.student_model.named_parameters()}))
    run.train_step(0, window, {}, log_step=True)
    assert all(g is None or g.abs().sum() == 0 for g in captured.values())
    metrics = window.reduce()
    assert metrics["sdpo/success_sample_fraction"] == 0.0 and metrics["loss"] == 0.0


def test_a_warning_is_logged_when_no_rollout_succeeds_or_a_group_is_all_equal(tokenizer, tmp_path, monkeypatch, caplog):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", group_completions(4))
    run = distiller(tokenizer, tmp_path, reward_funcs=["contains_answer"], max_steps=1)
    with caplog.at_level(logging.WARNING, logger="distill.methods.sdpo.stage"):
        run.train()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "no rollout reached success_reward_threshold 1.0" in messages and "groups have all rewards equal" in messages


def test_a_failing_reward_function_names_the_row_and_checkpoints_before_stopping(tokenizer, tmp_path):
    rows = answer_rows(8)
    run = distiller(tokenizer, tmp_path, rows=rows, reward_funcs=["tests.methods.sdpo_rewards:raises_on_row_5"],
                    max_steps=8, distillation_weight=0.0, per_device_train_batch_size=2, gradient_accumulation_steps=1)
    with pytest.raises(RewardFunctionError, match=r"(?s)raises_on_row_5 raised on dataset row 5 .*checkpointed at step \d+") as error:
        run.train()
    step = int(error.value.args[0].split("checkpointed at step ")[1].split(" ")[0])
    assert (tmp_path / "run" / "checkpoints" / f"step-{step:06d}").is_dir()
    assert 5 in run.parts.sampler.micro_batch_indices(step)[0]


def final_weights(run_dir):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def test_a_resumed_run_equals_an_uninterrupted_one_ema_teacher_and_reused_rollouts_included(tokenizer, tmp_path):
    settings = dict(distillation_weight=0.5, teacher_model_kind="ema", teacher_update_rate=0.5, max_steps=4, save_steps=1,
                    save_total_limit=5, learning_rate=3e-3, num_iterations=2, reward_funcs=["tests.methods.sdpo_rewards:odd_length"])
    straight = distiller(tokenizer, tmp_path / "straight", **settings)
    straight.train()
    distiller(tokenizer, tmp_path / "cut", **{**settings, "max_steps": 3}).train()
    hooks = torch.load(tmp_path / "cut" / "run" / "checkpoints" / "step-000003" / "hooks.pt", weights_only=True)
    assert set(hooks) == {"ema_teacher", "rollout"} and hooks["rollout"]["step"] == 2  # inside a reuse window
    resumed = distiller(tokenizer, None, config=resume_config(tmp_path / "cut" / "run", {"max_steps": 4}), resume=True)
    resumed.train()
    expected, actual = final_weights(tmp_path / "straight" / "run"), final_weights(tmp_path / "cut" / "run")
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    for (name, a), (_, b) in zip(straight.teacher.copy.named_parameters(), resumed.teacher.copy.named_parameters()):
        assert torch.equal(a, b), name
    straight_last = [TEACHER_PROMPT.of(c) for mb in straight.rollout._reused[1] for c in mb.completions]
    resumed_last = [TEACHER_PROMPT.of(c) for mb in resumed.rollout._reused[1] for c in mb.completions]
    assert straight_last == resumed_last  # the demonstration choice of the restored rollout


# --------------------------------------------------------------------- processes: groups spread out --
def _sdpo_step(rank, world_size, tmp, batch, accumulation, overrides):
    from pathlib import Path

    import distill.training.student_sampler

    original = distill.training.student_sampler.generate_completions
    distill.training.student_sampler.generate_completions = group_completions(batch * accumulation)
    try:
        torch.manual_seed(0)
        tokenizer = train_tiny_tokenizer()
        config = config_for(Path(tmp) / f"rank{rank}", per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                            max_grad_norm=0.0, num_generations=4, **overrides)
        run = distiller(tokenizer, None, rows=answer_rows(8), config=config)
        result = first_step_gradient(run)
        completions = [c for mb in run.rollout.take(0, {}) for c in mb.completions]
        result["local_tokens"] = sum(len(c.completion_ids) for c in completions)
        result["texts"] = [tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in completions]
        result["reprompts"] = [None if TEACHER_PROMPT.of(c) is None else tokenizer.decode(TEACHER_PROMPT.of(c)[0]) for c in completions]
        return result
    finally:
        distill.training.student_sampler.generate_completions = original


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    {"distillation_weight": 0.0, "loss_type": "grpo"},
    {"distillation_weight": 0.0, "loss_type": "grpo", "fsdp": True},  # GRPO has no self-teacher: it shards
    {"distillation_weight": 0.5, "loss_type": "dr_grpo", "distillation_mode": "full_logits", "beta": 0.0},
], ids=["grpo", "grpo_fsdp", "sdpo"])
def test_gradient_and_metrics_are_split_invariant_with_groups_spread_over_processes(tmp_path, overrides):
    """Global batch 8, groups of 4: one process with one micro-batch of 8, or two processes with two
    micro-batches of 2 each (every group spans both micro-batches of a process... and group 2 sits on the
    other process). The gradient and every logged mean are the same; tokens per process differ."""
    single = _sdpo_step(0, 1, str(tmp_path / "single"), 8, 1, {k: v for k, v in overrides.items() if k != "fsdp"})
    ranks = run_in_processes(_sdpo_step, world_size=2, args=(str(tmp_path / "multi"), 2, 2, overrides))
    assert ranks[0]["local_tokens"] != ranks[1]["local_tokens"]
    assert any(g.abs().sum() > 0 for g in single["grads"].values())
    for rank in ranks:
        assert_same_gradients(rank["grads"], single["grads"])
    for key, value in single["metrics"].items():
        if key.startswith(("reward", "sdpo", "loss", "forward_kl")):
            assert ranks[0]["metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key  # GRPO losses sit near 0
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


@pytest.mark.slow
def test_groups_spanning_processes_mine_demonstrations_from_the_other_process(tmp_path):
    """Groups of 4 over 2 processes with 2 rows each: a row's demonstration may be a row of the other
    process; the stage sees the whole group there (success fractions equal the single-process ones)."""
    overrides = {"distillation_weight": 1.0}
    single = _sdpo_step(0, 1, str(tmp_path / "single"), 4, 1, overrides)
    ranks = run_in_processes(_sdpo_step, world_size=2, args=(str(tmp_path / "multi"), 1, 2, overrides))
    for key in ("sdpo/success_sample_fraction", "sdpo/reprompt_sample_fraction", "sdpo/success_group_fraction", "reward/mean"):
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key]), key
    texts = ranks[0]["texts"] + ranks[1]["texts"]
    assert texts == single["texts"]
    success = [len(t) % 2 == 1 for t in texts]
    across = 0
    for i, reprompt in enumerate(ranks[0]["reprompts"] + ranks[1]["reprompts"]):
        sibling = next((j for j in range(i - i % 4, i - i % 4 + 4) if success[j] and j != i), None)
        assert (reprompt is None) == (sibling is None)
        if sibling is not None:
            assert f"Correct solution:\n\n{texts[sibling]}\n" in reprompt
            across += sibling // 2 != i // 2  # the demonstration lives on the other process
    assert across > 0
    assert_same_gradients(ranks[0]["grads"], single["grads"])


def _sampled_texts(rank, world_size, tmp):
    """Real sampling: one group of 4 spread over the processes (each holds the same prompt twice)."""
    from pathlib import Path

    tokenizer = train_tiny_tokenizer()
    config = config_for(Path(tmp) / f"rank{rank}", per_device_train_batch_size=4 // world_size, gradient_accumulation_steps=1,
                        num_generations=4, distillation_weight=0.0, max_new_tokens=8)
    run = distiller(tokenizer, None, rows=answer_rows(8), config=config)
    run.setup()
    return [list(c.completion_ids) for mb in run.rollout.take(0, {}) for c in mb.completions]


@pytest.mark.slow
def test_processes_holding_the_same_prompt_sample_different_completions(tmp_path):
    """Every process has its own sampling stream: a group spread over two processes gets four samples, not
    the same two samples twice."""
    ranks = run_in_processes(_sampled_texts, world_size=2, args=(str(tmp_path / "multi"),))
    assert ranks[0] != ranks[1] and len({tuple(ids) for rank in ranks for ids in rank}) > 2


def test_sdpo_model_card_cites_the_paper(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", group_completions(4))
    distiller(tokenizer, tmp_path, max_steps=1).train()
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "2601.20802" in card and "hubotter2026sdpo" in card and "SDPO" in card


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_eval_before_after_and_distill_eval_work_on_sdpo_and_grpo_runs(tokenizer, tmp_path, model_dirs, weight):
    import json

    from distill.cli import main

    eval_file = tmp_path / "heldout.jsonl"
    eval_file.write_text("\n".join(json.dumps(r) for r in answer_rows(4)) + "\n")
    config = config_for(tmp_path, student=str(model_dirs["student"]), eval_before_after=True, eval_dataset=str(eval_file),
                        eval_split="train", eval_max_new_tokens=6, max_teacher_prompt_length=96, distillation_weight=weight)
    Distiller(config, train_dataset=datasets.Dataset.from_list(answer_rows(8))).train()
    report = json.loads((tmp_path / "run" / "eval" / "eval.json").read_text())
    assert report["metrics"]["after"]["answer_accuracy"]["prompts"] == 4
    assert report["metrics"]["before"]["on_teacher_completions"]["forward_kl"] == pytest.approx(0.0, abs=1e-5)  # the initial model
    assert main(["eval", str(tmp_path / "run"), "--max-new-tokens", "6"]) == 0
    cli = json.loads((tmp_path / "run" / "eval-cli" / "eval.json").read_text())
    assert cli["metrics"]["student"]["on_teacher_completions"]["forward_kl"] == pytest.approx(
        report["metrics"]["after"]["on_teacher_completions"]["forward_kl"], rel=1e-4)
