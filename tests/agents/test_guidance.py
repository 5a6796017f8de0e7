"""The curricula over the student's conversations (`distill.agents.guidance`): Guided-OPD's decaying probability and
its draw (a function of seed, step, row and turn, so the same however the rows are split), the teacher's turns in the
tool-call loop (the same ids continued, attended and not trained unless asked, counted), and TCOD's depth."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distill.agents.guidance import DepthCurriculum, GuidedTurns
from distill.agents.loop import Guide, LoopSettings, ToolLoop, loop_metrics, run_tool_loop
from distill.conversations.calls import ToolCalls
from distill.rendering import ConversationRenderer, EnvironmentTurns
from distill.seeds import guided_turn_draw
from tests.conversations.conftest import family_tokenizer
from tests.conversations.test_loop import TOOLS, Script, calls


def test_the_guidance_probability_decays_linearly_to_zero_and_stays_there():
    guided = GuidedTurns(0.8, decay_steps=10.0)
    assert [guided.probability(s) for s in (0, 5, 10, 11, 100)] == pytest.approx([0.8, 0.4, 0.0, 0.0, 0.0])
    assert not any(guided.teacher_writes(0, 10, list(range(50)), 0))  # p = 0: the student writes every turn


def test_the_draw_depends_on_seed_step_row_and_turn_only_and_hits_the_probability():
    rows = list(range(8))
    guided = GuidedTurns(0.5, decay_steps=100.0)
    whole = guided.teacher_writes(3, 7, rows, 2)
    split = guided.teacher_writes(3, 7, rows[:4], 2) + guided.teacher_writes(3, 7, rows[4:], 2)
    assert whole == split == [guided_turn_draw(3, 7, r, 2) < 0.5 for r in rows]  # split over processes: the same
    assert guided.teacher_writes(3, 7, [5, 1], 2) == [whole[5], whole[1]]  # a row's choice, wherever it is listed
    draws = [guided_turn_draw(0, step, row, turn) for step in range(20) for row in range(20) for turn in range(10)]
    assert all(0.0 <= u < 1.0 for u in draws) and len(set(draws)) == len(draws)
    chosen = sum(u < 0.3 for u in draws) / len(draws)
    assert 0.27 < chosen < 0.33  # 4000 draws at p = 0.3 (the binomial's sd: 0.007)
    assert guided_turn_draw(0, 1, 2, 3) != guided_turn_draw(1, 1, 2, 3) != guided_turn_draw(0, 1, 2, 4)


def test_the_depth_curriculum_adds_one_turn_every_interval_steps_up_to_max_turns():
    depth = DepthCurriculum(interval=5)
    assert [depth.max_turns(s, 4) for s in (0, 4, 5, 9, 10, 15, 100)] == [1, 1, 2, 2, 3, 4, 4]


def guided_loop(trained: bool, writes: list[list[bool]], teacher_script: list[list[str]], script: list[list[str]]):
    """The loop over one prompt per row of `script`; `writes[turn][row]`: the teacher writes that turn."""
    tokenizer, eos = family_tokenizer("chatml")
    renderer = ConversationRenderer(tokenizer, eos)
    prompt_ids = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": f"question {r}"}],
                                                          add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)["input_ids"] for r in range(len(script))]
    student, teacher = Script(tokenizer, eos[0], script), Script(tokenizer, eos[0], teacher_script)
    student.firsts = teacher.firsts = prompt_ids
    guide = Guide(teacher, lambda turn, rows: [writes[turn][r] for r in rows], trained)
    tool_calls = ToolCalls(TOOLS, None, 1.0, workers=1)
    try:
        trajectories = run_tool_loop(student, prompt_ids, tool_calls.open([{}] * len(script), list(range(len(script)))),
                                     EnvironmentTurns(tokenizer, renderer, eos), lambda ids: tokenizer.decode(ids), eos,
                                     LoopSettings(3, 400, True), guide=guide)
    finally:
        tool_calls.close()
    return tokenizer, eos, prompt_ids, student, teacher, trajectories


@pytest.mark.parametrize("trained", [False, True])
def test_the_teacher_writes_its_turns_in_the_same_context_attended_and_trained_only_if_asked(trained):
    call = calls(("add", {"a": 2, "b": 3}))
    # row 0: the teacher calls the tool, the student answers; row 1: the student calls, the teacher answers
    tokenizer, eos, prompts, student, teacher, (first, second) = guided_loop(
        trained, [[True, False], [False, True]], [[call, ""], ["", "It is 5, says the teacher."]],
        [["", "It is 5."], [call, ""]])
    assert [(row, turn) for row, turn, _ in teacher.seen] == [(0, 0), (1, 1)]
    assert [(row, turn) for row, turn, _ in student.seen] == [(1, 0), (0, 1)]
    call_ids = tokenizer(call, add_special_tokens=False)["input_ids"] + eos
    answer = tokenizer("It is 5.", add_special_tokens=False)["input_ids"] + eos
    # the teacher's turn is the conversation's first model turn, its ids kept, and the student continued them
    assert first.ids[: len(call_ids)] == call_ids and first.ids[-len(answer):] == answer
    assert student.seen[1][2] == prompts[0] + first.ids[: -len(answer)]
    assert first.trained == [trained] * len(call_ids) + [False] * (len(first.ids) - len(call_ids) - len(answer)) \
        + [True] * len(answer)
    assert first.log_probs[: len(call_ids)] == [0.0] * len(call_ids)  # no student log-prob for the teacher's tokens
    assert first.log_probs[-len(answer):] == [-0.5] * len(answer)
    model_turns = [segment for segment in first.layout.segments if segment.assistant]
    assert [segment.length for segment in model_turns] == [len(call_ids), len(answer)]  # both are model turns
    assert (first.turns, first.guided_turns, first.calls) == (2, 1, 1)
    assert (second.turns, second.guided_turns, second.calls) == (2, 1, 1) and not second.hit_max
    assert second.trained[-1] is trained  # the teacher's answer ends it
    metrics = loop_metrics([first, second])
    assert metrics["tools/teacher_turn_fraction"] == (2.0, 4.0) and metrics["tools/calls_per_turn"] == (2.0, 4.0)


def test_without_a_guide_or_at_probability_zero_the_loop_is_the_students_alone():
    call = calls(("add", {"a": 2, "b": 3}))
    script = [[call, "It is 5."], ["Just this."]]
    _, _, _, student, teacher, guided = guided_loop(False, [[False, False]] * 3, [["x", "x"]] * 2, script)
    tokenizer, eos = family_tokenizer("chatml")
    renderer = ConversationRenderer(tokenizer, eos)
    plain_student = Script(tokenizer, eos[0], script)
    plain_student.firsts = student.firsts
    tool_calls = ToolCalls(TOOLS, None, 1.0, workers=1)
    try:
        plain = run_tool_loop(plain_student, student.firsts, tool_calls.open([{}] * 2, [0, 1]),
                              EnvironmentTurns(tokenizer, renderer, eos), lambda ids: tokenizer.decode(ids), eos,
                              LoopSettings(3, 400, True))
    finally:
        tool_calls.close()
    assert teacher.seen == []
    for g, p in zip(guided, plain):
        assert (g.ids, g.trained, g.log_probs, g.layout, g.guided_turns) == (p.ids, p.trained, p.log_probs, p.layout, 0)


def test_a_rollouts_own_max_turns_bounds_its_conversations():
    tokenizer, eos = family_tokenizer("chatml")
    renderer = ConversationRenderer(tokenizer, eos)
    loop = ToolLoop(ToolCalls(TOOLS, None, 1.0, workers=1), EnvironmentTurns(tokenizer, renderer, eos),
                    lambda ids: tokenizer.decode(ids), LoopSettings(4, 400))
    prompt = tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": "question 0"}], add_generation_prompt=True,
                                                     tokenize=False), add_special_tokens=False)["input_ids"]
    script = Script(tokenizer, eos[0], [[calls(("add", {"a": 1, "b": 1}))] * 4])
    script.firsts = [prompt]
    row = SimpleNamespace(row={}, index=0)  # the loop reads an example's row and index only
    try:
        for max_turns, expected in ((None, 4), (1, 1), (2, 2)):
            script.seen.clear()
            (t,), _ = loop.run(script, [prompt], [row], eos, max_turns=max_turns)  # type: ignore[list-item]
            assert t.turns == expected and t.unanswered_calls == 1  # the last allowed turn's call is not run
    finally:
        loop.close()
