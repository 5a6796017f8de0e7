"""Multi-turn on-policy distillation in runs (`distill.methods.multi_turn`): Guided-OPD's teacher turns written where
the seeded draw says, attended and not trained; TCOD's depth growing with the step; SOD's weights in the loss; the
per-turn metrics; and every setting refused where nothing would read it or no teacher could act on it, before models
load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from distill import DistillConfig
from distill.agents.guidance import GuidedTurns
from distill.generation.sample import Sample
from distill.seeds import guided_turn_draw
from distill.teachers.base import Teacher
from distill.training.plan import RolloutSettings
from distill.training.student_sampler import StudentSampler
from tests.helpers.training import make_distiller

PLUS = "tests.conversations.toolbox:plus"
ROWS = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}]} for i in range(8)]
ON_POLICY = dict(method="on_policy", seq_kd=True, lmbda_schedule="step")  # the mixing fields at their defaults


def scripted(tokenizer, answer: str, arguments: dict):
    """A stand-in for an engine: a conversation with no tool result yet gets a call to `plus` with `arguments`, one with
    a result gets `answer`; each turn ends with EOS."""
    call = tokenizer(f'<tool_call>\n{{"name": "plus", "arguments": {json.dumps(arguments)}}}\n</tool_call>',
                     add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    said = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def generate(model, prompts, sampling, *args, with_log_probs=False, **kwargs):
        out = []
        for prompt in prompts:
            ids = (said if "<|im_start|>tool" in tokenizer.decode(prompt) else call)[: sampling.max_new_tokens]
            out.append(Sample(list(ids), False, [-0.25] * len(ids) if with_log_probs else None))
        return out

    return generate, call, said


@pytest.fixture
def scripted_pair(tokenizer, monkeypatch):
    """The student calls plus(2, 3) then says "It is 5."; the teacher calls plus(4, 1) then says "Five, says the
    teacher." (`distill.teachers.local`'s sampling, which a teacher model's turns use)."""
    import distill.teachers.local
    import distill.training.student_sampler

    student = scripted(tokenizer, "It is 5.", {"a": 2, "b": 3})
    teacher = scripted(tokenizer, "Five, says the teacher.", {"a": 4, "b": 1})
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions", student[0])
    monkeypatch.setattr(distill.teachers.local, "generate_completions", teacher[0])
    return student, teacher


def test_the_teacher_writes_the_turns_its_draw_gives_it_attended_and_not_trained(tokenizer, tmp_path, scripted_pair):
    (_, student_call, student_answer), (_, teacher_call, teacher_answer) = scripted_pair
    run = make_distiller(tokenizer, tmp_path, rows=ROWS, **ON_POLICY, max_new_tokens=200, max_prompt_length=300,
                         tools=[PLUS], max_turns=3, guided_turns_probability=0.6, max_steps=2, seed=3)
    run.setup()
    batches = run.rollout.take(0, {})
    places = iter(range(4))  # one process, 2 micro-batches of 2: the rows' places in the step are their order
    writers = set()
    for batch in batches:
        expected_turns = []
        for completion in batch.completions:
            place = next(places)
            teacher = [guided_turn_draw(3, 0, place, turn) < 0.6 for turn in range(2)]  # p(0) = 0.6
            writers.add(tuple(teacher))
            first = teacher_call if teacher[0] else student_call
            last = teacher_answer if teacher[1] else student_answer
            ids, mask = completion.completion_ids, completion.mask
            assert ids[: len(first)] == first and ids[-len(last):] == last
            assert mask == (not teacher[0],) * len(first) + (False,) * (len(ids) - len(first) - len(last)) \
                + (not teacher[1],) * len(last)
            turns = [s for s in completion.layout.segments if s.assistant]
            assert [s.length for s in turns] == [len(first), len(last)]  # both model turns, whoever wrote them
            expected_turns += [0] * len(first) * (not teacher[0]) + [1] * len(last) * (not teacher[1])
        assert batch.turns.tolist() == expected_turns  # each trained token's model turn, the teacher's counted
    assert len(writers) > 2  # the draws mixed the writers
    metrics = run.rollout.take_stage_metrics()
    fraction = sum(guided_turn_draw(3, 0, r, k) < 0.6 for r in range(4) for k in range(2)) / 8
    assert metrics["tools/teacher_turn_fraction"][0] / metrics["tools/teacher_turn_fraction"][1] == fraction
    assert metrics["tools/guidance_probability"][0] / metrics["tools/guidance_probability"][1] == pytest.approx(0.6)
    assert metrics["tools/calls_per_turn"][0] / metrics["tools/calls_per_turn"][1] == 0.5
    run.train()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [record["tools/guidance_probability"] for record in logged] == pytest.approx([0.6, 0.3])
    assert all(0.0 <= record["reverse_kl/turn_0"] and 0.0 <= record["reverse_kl/turn_1"] for record in logged)
    assert "reverse_kl/turn_2" not in logged[0]  # no conversation had a third turn


def test_trained_teacher_turns_and_the_per_turn_index_of_each_trained_token(tokenizer, tmp_path, scripted_pair):
    (_, student_call, _), (_, teacher_call, teacher_answer) = scripted_pair
    run = make_distiller(tokenizer, tmp_path, rows=ROWS, method="gkd", lmbda=1.0, max_new_tokens=200,
                         max_prompt_length=300, tools=[PLUS], guided_turns_probability=1.0, guided_turns_trained=True)
    run.setup()
    for batch in run.rollout.take(0, {}):  # p(0) = 1: the teacher wrote every turn, and each is trained
        assert all(all(c.mask[: len(teacher_call)]) and all(c.mask[-len(teacher_answer):]) for c in batch.completions)
        per_row = [[0] * len(teacher_call) + [1] * len(teacher_answer) for _ in batch.completions]
        assert batch.turns.tolist() == [t for row in per_row for t in row]


def test_the_depth_curriculum_lets_the_conversations_grow_one_turn_every_interval(tokenizer, tmp_path, monkeypatch):
    import distill.training.student_sampler

    generate, call, _ = scripted(tokenizer, "never said", {"a": 1, "b": 1})
    monkeypatch.setattr(distill.training.student_sampler, "generate_completions",
                        lambda model, prompts, sampling, *args, **kwargs: generate(model, [[]] * len(prompts), sampling))
    run = make_distiller(tokenizer, tmp_path, rows=ROWS, **ON_POLICY, max_new_tokens=200, max_prompt_length=300,
                         tools=[PLUS], max_turns=2, depth_curriculum_interval=2, max_steps=6)
    run.train()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [record["tools/turns"] for record in logged] == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # it calls every turn
    assert [record["tools/max_turns"] for record in logged] == [1.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # up to max_turns
    assert [record["tools/unanswered_calls"] for record in logged] == [1.0] * 6  # the last turn's call is not run
    assert "reverse_kl/turn_1" in logged[-1] and "reverse_kl/turn_1" not in logged[0]


def test_sod_weighs_the_students_turns_in_a_run(tokenizer, tmp_path, scripted_pair):
    losses = {}
    for weighting in (False, True):
        torch.manual_seed(0)
        run = make_distiller(tokenizer, tmp_path / str(weighting), rows=ROWS, **ON_POLICY, max_new_tokens=200,
                             max_prompt_length=300, tools=[PLUS], step_divergence_weighting=weighting, max_steps=1)
        run.train()
        record = json.loads((tmp_path / str(weighting) / "run" / "metrics.jsonl").read_text().splitlines()[0])
        losses[weighting] = record["loss"]
    assert "step_divergence/weight" in record and record["step_divergence/weight"] != 1.0
    assert record["step_divergence/gap"] > 0 and losses[True] != losses[False]


@pytest.mark.parametrize("values, match", [
    ({"guided_turns_probability": 0.5}, "guided_turns_probability is only read with tools or an environment"),
    ({"depth_curriculum_interval": 3}, "depth_curriculum_interval is only read with tools or an environment"),
    ({"step_divergence_weighting": True}, "step_divergence_weighting is only read with tools"),
    ({"tools": [PLUS], "guided_turns_trained": True}, "guided_turns_trained is only read with guided_turns_probability > 0"),
    ({"tools": [PLUS], "step_divergence_delta": 0.5}, "step_divergence_delta is only read with step_divergence_weighting"),
    ({"tools": [PLUS], "method": "gkd", "lmbda": 0.0, "guided_turns_probability": 0.5},
     "guided_turns_probability is only read with .* micro-batches the student samples"),
    ({"tools": [PLUS], "method": "sdft", "guided_turns_probability": 0.5}, "guided_turns_probability is not read by method sdft"),
    ({"tools": [PLUS], "guided_turns_probability": 1.5}, r"guided_turns_probability must be in \[0, 1\]"),
    ({"tools": [PLUS], "guided_turns_probability": 0.5, "guided_turns_decay_fraction": 0.0},
     r"guided_turns_decay_fraction must be in \(0, 1\]"),
    ({"tools": [PLUS], "depth_curriculum_interval": -1}, "depth_curriculum_interval must be >= 0"),
    ({"tools": [PLUS], "guided_turns_probability": 0.5, "teacher_url": "http://127.0.0.1:9"},
     "teacher_url only scores: it cannot write a turn"),
    ({"tools": [PLUS], "guided_turns_probability": 0.5, "guided_turns_trained": True, "max_staleness": 1},
     "guided_turns_trained: true with max_staleness > 0"),
])
def test_settings_nothing_reads_or_no_teacher_can_act_on_are_refused(values, match):
    config = DistillConfig(**{"method": "on_policy", **values})
    with pytest.raises(ValueError, match=match):
        config.validate()


def test_the_options_validate_where_they_are_read():
    DistillConfig(method="on_policy", tools=[PLUS], guided_turns_probability=0.5, guided_turns_trained=True,
                  guided_turns_decay_fraction=0.5, teacher_sampling_temperature=0.7, depth_curriculum_interval=4,
                  step_divergence_weighting=True, step_divergence_delta=0.5).validate()
    DistillConfig(method="gkd", lmbda=0.5, tools=[PLUS], guided_turns_probability=0.5,
                  step_divergence_weighting=True).validate()
    DistillConfig(method="on_policy", tools=[PLUS], guided_turns_probability=0.5, max_staleness=1).validate()


class ScoringOnly(Teacher):
    """A teacher that samples from prompts of its own (as a self-teacher or another tokenizer does)."""

    can_generate = True
    continues_prompts = False

    def score(self, batch, temperature):
        raise AssertionError("not scored here")


def test_a_teacher_that_cannot_continue_the_students_ids_is_refused_for_guided_turns():
    from distill.generation.engine import SamplingParams

    sampling = SamplingParams(1.0, 1.0, 0, 8)
    settings = RolloutSettings(sampling, sampling, 1, 2, 0, False, guided_turns=GuidedTurns(0.5, 2.0))
    for teacher in (None, ScoringOnly()):
        with pytest.raises(ValueError, match="guided_turns_probability > 0 .* use a teacher model with the student's "
                                             "tokenizer"):
            StudentSampler(None, [], [], settings, [0], 0, 8, torch.device("cpu"), lambda *a: [], teacher=teacher)  # type: ignore[arg-type]


def test_the_bundled_agent_recipe_validates_with_each_option(tmp_path):
    from distill.config.io import load_yaml_recipe

    recipe = load_yaml_recipe(Path(__file__).resolve().parents[2] / "src" / "distill" / "recipes" / "agent.yaml")
    for option in ({"guided_turns_probability": 0.5}, {"depth_curriculum_interval": 4},
                   {"step_divergence_weighting": True}):
        DistillConfig(**{**recipe, **option}).validate()


def test_guided_turns_sampled_ahead_are_drawn_from_each_rows_own_seed(tokenizer, tmp_path):
    """max_staleness 1: the worker thread samples the teacher's turns too, each row from its own seed (never the process
    RNG the training thread draws from), so two runs train the same weights."""
    weights = []
    for name in ("first", "second"):
        run = make_distiller(tokenizer, tmp_path / name, rows=ROWS, **ON_POLICY, max_new_tokens=12, tools=[PLUS],
                             guided_turns_probability=0.5, max_staleness=1, max_steps=2)
        run.train()
        weights.append({n: p.detach().clone() for n, p in run.student_model.named_parameters()})
        logged = [json.loads(line) for line in (tmp_path / name / "run" / "metrics.jsonl").read_text().splitlines()]
        assert 0.0 < logged[0]["tools/teacher_turn_fraction"] < 1.0
    assert all(torch.equal(weights[0][n], weights[1][n]) for n in weights[0])


def test_the_model_card_names_the_options_and_their_papers():
    from distill.methods.base import get_method

    plain = {"beta": 0.5, "off_policy_beta": 0.0, "lmbda": 0.5, "lmbda_schedule": "step", "seq_kd": True}
    assert "arXiv" not in get_method("gkd").describe_loss(plain)
    line = get_method("on_policy").describe_loss({**plain, "guided_turns_probability": 0.5, "depth_curriculum_interval": 5,
                                                  "step_divergence_weighting": True})
    assert "Guided-OPD, arXiv 2606.15912" in line and "TCOD, arXiv 2604.24005" in line and "SOD, arXiv 2605.07725" in line
