"""Rewards and self-teachers over conversations: grpo / sdpo score a trajectory on its last model turn and on its
environment's own reward (`get_reward`), sdpo re-prompts with a successful sibling's whole transcript, and a
self-teacher's prompt shows the tools and the environment's observation as the student's did."""

from __future__ import annotations

import json
import math

import datasets
import pytest
import torch

from distill.conversations.calls import ToolCalls
from distill.conversations.environments import EnvironmentFactory
from distill.conversations.layout import Layout, Segment
from distill.errors import RewardFunctionError
from distill.generation.sample import Sample
from distill.methods.sdpo.rewards import Rewards, load_reward_function
from distill.teachers.self_teacher import DISTILLED, TEACHER_PROMPT
from distill.training.trainer import Distiller
from tests.conftest import tiny_lm
from tests.helpers.training import FAST

ENVIRONMENT = "tests.conversations.toolbox:Adder"


def rows(n: int) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": f"What is 2 + {3 + i}?"}], "answer": str(5 + i)} for i in range(n)]


def seeded_turns(tokenizer):
    """Scripted generation: a first turn calls `plus` or gives up, by the parity of the row's seed (siblings differ);
    a turn after a tool result answers with the sum's text."""
    eos = tokenizer.eos_token_id
    call = tokenizer('<tool_call>\n{"name": "plus", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
                     add_special_tokens=False)["input_ids"] + [eos]
    give_up = tokenizer("I cannot say.", add_special_tokens=False)["input_ids"] + [eos]
    answer = tokenizer("It is 5.", add_special_tokens=False)["input_ids"] + [eos]

    def generate(model, prompts, sampling, *args, with_log_probs=False, seeds=None, **kwargs):
        out = []
        for prompt, seed in zip(prompts, seeds):
            ids = answer if "<|im_start|>tool" in tokenizer.decode(prompt) else (call if seed % 2 == 0 else give_up)
            out.append(Sample(list(ids), False, [-0.5] * len(ids) if with_log_probs else None))
        return out

    return generate


def sdpo_run(tokenizer, tmp_path, environment=ENVIRONMENT, **fields) -> Distiller:
    values = {**{k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}, "method": "sdpo",
              "num_generations": 2, "max_new_tokens": 120, "max_prompt_length": 300,
              "environment": environment, "max_turns": 3, "output_dir": str(tmp_path / "run"), **fields}
    if values.get("distillation_weight", 1.0) > 0:
        values["max_reprompt_length"] = 390
    from distill.config import DistillConfig

    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    return Distiller(DistillConfig(**values), student=student, tokenizer=tokenizer,
                     train_dataset=datasets.Dataset.from_list(rows(8)))


def test_rewards_read_a_conversations_last_turn_and_its_environments_reward():
    rewards = Rewards([load_reward_function("contains_answer")], [1.0], environment=True)
    assert rewards.names == ["contains_answer", "environment"] and rewards.weights == [1.0, 1.0]
    values = rewards([[]] * 2, ["It is 5.", "no"], [{"answer": "5"}, {"answer": "5"}], [0, 1], [1.0, 0.0])
    assert torch.equal(values, torch.tensor([[1.0, 1.0], [0.0, 0.0]], dtype=torch.float64))
    with pytest.raises(RewardFunctionError, match=r"dataset rows \[1\] have none"):
        rewards([[]] * 2, ["a", "b"], [{"answer": "5"}] * 2, [0, 1], [1.0, None])
    layout = Layout((Segment(3, True), Segment(2, False, ({"role": "tool", "name": "plus", "content": "5"},)),
                     Segment(2, True)))
    assert layout.final_turn([1, 2, 3, 4, 5, 6, 7]) == [6, 7]
    assert layout.transcript([1, 2, 3, 4, 5, 6, 7], lambda ids: " ".join(map(str, ids))) == (
        "1 2 3\n<tool_response>\n5\n</tool_response>\n6 7")


def reward_of(factory: str, index: int) -> float:
    """The reward of an environment made from row {"answer": "5"} (dataset row `index`), asked in a tool worker."""
    loaded = EnvironmentFactory.load(f"tests.conversations.toolbox:{factory}", set())
    assert loaded.owns_reward and [s["function"]["name"] for s in loaded.schemas] == ["plus"]
    calls = ToolCalls({}, loaded, 10.0, workers=1)
    try:
        return calls.open([{"answer": "5"}], [index]).rewards()[0]
    finally:
        calls.close()


@pytest.mark.parametrize("factory, match", [
    ("BrokenReward", r"environment: tests.conversations.toolbox:BrokenReward.get_reward raised RuntimeError: the "
                     r"scorer is down \(dataset row 3\)"),
    ("NotANumber", r"get_reward returned 'good' for dataset row 3; it returns a finite number"),
])
def test_an_environment_reward_that_fails_names_the_environment_and_the_row(factory, match):
    with pytest.raises(RewardFunctionError, match=match):
        reward_of(factory, 3)
    assert reward_of("AsyncAdder", 0) == 0.0


@pytest.mark.parametrize("environment, reward", [(ENVIRONMENT, 1.0), ("tests.conversations.toolbox:AsyncAdder", 2.0)])
def test_grpo_learns_from_the_environments_reward(tokenizer, tmp_path, monkeypatch, environment, reward):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", seeded_turns(tokenizer))
    run = sdpo_run(tokenizer, tmp_path, environment, reward_funcs=[], distillation_weight=0.0, loss_type="grpo",
                   success_reward_threshold=reward)
    run.setup()
    completions = [c for mb in run.rollout.take(0, {}) for c in mb.completions]
    metrics = run.rollout.take_stage_metrics()
    layouts = [c.layout for c in completions]
    assert all(layout is not None for layout in layouts)
    called = [layout.reward for layout in layouts]
    assert set(called) <= {0.0, reward} and called == [reward * (len(layout.segments) > 1) for layout in layouts]
    for completion in completions:  # reset's observation, in the prompt the student followed
        shown = f"(the numbers are 2 and {int(completion.example.answer) - 2})"
        assert shown in tokenizer.decode(completion.prompt_ids) and completion.layout.observation == f" {shown}"
    assert math.isclose(metrics["reward/environment/mean"][0], sum(called))
    result = run.train()
    assert result["steps"] == 2
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("reward/environment/mean" in record for record in logged)


def test_a_reward_function_scores_the_answer_not_a_tool_result_that_holds_it(tokenizer, tmp_path, monkeypatch):
    """contains_answer on a conversation reads its last model turn: a trajectory whose tool said "5" but whose answer
    did not is not rewarded."""
    import distill.training.student_sampler

    eos = tokenizer.eos_token_id
    call = tokenizer('<tool_call>\n{"name": "plus", "arguments": {"a": 2, "b": 3}}\n</tool_call>',
                     add_special_tokens=False)["input_ids"] + [eos]
    wrong = tokenizer("It is 6.", add_special_tokens=False)["input_ids"] + [eos]

    def generate(model, prompts, sampling, *args, with_log_probs=False, **kwargs):
        return [Sample(wrong if "<|im_start|>tool" in tokenizer.decode(p) else call) for p in prompts]

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", generate)
    run = sdpo_run(tokenizer, tmp_path, reward_funcs=["contains_answer"], distillation_weight=0.0, loss_type="grpo")
    run.setup()
    batch = run.rollout.take(0, {})[0]
    assert "<|im_start|>tool\n5<|im_end|>" in tokenizer.decode(batch.completions[0].completion_ids)
    metrics = run.rollout.take_stage_metrics()
    assert metrics["reward/contains_answer/mean"][0] == 0.0 and metrics["reward/environment/mean"][0] > 0


def test_sdpo_reprompts_a_failed_trajectory_with_a_successful_siblings_transcript(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", seeded_turns(tokenizer))
    run = sdpo_run(tokenizer, tmp_path, reward_funcs=[], distillation_weight=1.0)
    run.setup()
    completions = [c for mb in run.rollout.take(0, {}) for c in mb.completions]
    rewards = [c.layout.reward for c in completions]
    pairs = [(completions[k], completions[k + 1]) for k in range(0, len(completions), 2)]
    mixed = [pair for pair in pairs if {pair[0].layout.reward, pair[1].layout.reward} == {0.0, 1.0}]
    assert mixed, f"no group with one success and one failure (rewards {rewards}); change the seeds"
    for pair in mixed:
        failed = next(c for c in pair if c.layout.reward == 0.0)
        assert DISTILLED.of(failed)
        prompt = tokenizer.decode(TEACHER_PROMPT.of(failed)[0])
        assert "Correct solution:" in prompt and "<tool_response>\n5\n</tool_response>" in prompt
        assert '<tool_call>\n{"name": "plus"' in prompt and "It is 5." in prompt  # the sibling's turns, as text
        assert '"name": "plus"' in prompt.split("<|im_start|>user")[0]  # the tools, shown as to the student
        assert "(the numbers are 2 and" in prompt  # the observation
    result = run.train()
    assert result["steps"] == 2 and math.isfinite(result["train"]["loss"])


def test_sdft_shows_its_self_teacher_the_tools_and_the_observation(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", seeded_turns(tokenizer))
    data = [{**row, "privileged_context": "call plus"} for row in rows(8)]
    values = {**{k: v for k, v in FAST.items() if k not in ("seq_kd", "lmbda_schedule")}, "method": "sdft", "max_new_tokens": 120, "max_prompt_length": 300, "max_teacher_prompt_length": 390,
              "environment": ENVIRONMENT, "max_turns": 3, "output_dir": str(tmp_path / "run")}
    from distill.config import DistillConfig

    student = tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    run = Distiller(DistillConfig(**values), student=student, tokenizer=tokenizer,
                    train_dataset=datasets.Dataset.from_list(data))
    run.setup()
    completion = run.rollout.take(0, {})[0].completions[0]
    ids = run.teacher.teacher_prompt(completion.example, completion.layout.observation).ids
    prompt = tokenizer.decode(ids)
    assert '"name": "plus"' in prompt and "call plus" in prompt and "(the numbers are 2 and" in prompt
    result = run.train()
    assert result["steps"] == 2 and math.isfinite(result["train"]["loss"])
