"""Repetition: greedy answers that end in a loop, and distinct-n over all answers."""

from __future__ import annotations

import pytest

from distill.evaluation.repetition import answer_words, distinct_n, loop_period, repetition


@pytest.mark.parametrize("answer, period", [
    ("A concept of a concept of a concept of a concept of a", 3),  # the default run's answers at step 72, cut mid-unit
    ("the the the the the the", 1),
    ("I like it. I LIKE it! i like it", 3),  # case and punctuation do not hide a loop
    ("Paris is the capital of France. It is on the Seine.", None),
    ("no no no", None),  # three repeats, but shorter than a loop's 6 words
    ("a b c a b c a b", None),  # 2 2/3 repeats of a three-word unit
    ("x y x y x y x y done", None),  # a loop the answer leaves is not one it ends in
    ("one two three four five six seven eight " * 3, 8),
    ("one two three four five six seven eight nine " * 3, None),  # a unit longer than MAX_PERIOD words
])
def test_an_answer_loops_when_a_short_unit_repeats_to_its_end(answer, period):
    assert loop_period(answer_words(answer)) == period


def test_the_shortest_period_is_reported():
    assert loop_period(["a"] * 12) == 1  # also 2-, 3-, ... periodic
    assert loop_period(list("abab" * 3)) == 2


def test_distinct_n_counts_over_all_answers_together():
    answers = [["a", "b", "a", "b"], ["a", "c"]]
    assert distinct_n(answers, 1) == 3 / 6
    assert distinct_n(answers, 2) == len({("a", "b"), ("b", "a"), ("a", "c")}) / 4
    assert distinct_n([["a"]], 2) == 0.0 and distinct_n([], 1) == 0.0


def test_the_summary_counts_looping_answers_and_shows_one_unit():
    result = repetition(["A concept of a concept of a concept of a concept", "Paris.", "la la la la la la la"])
    assert result["answers"] == 3 and result["looping"] == 2
    assert result["loop_fraction"] == pytest.approx(2 / 3)
    assert result["example"] == "of a concept"
    assert result["distinct_1"] == pytest.approx(len({"a", "concept", "of", "paris", "la"}) / (11 + 1 + 7))
    assert repetition([])["loop_fraction"] == 0.0 and repetition(["Hi."])["example"] is None


def test_the_report_states_every_condition_a_loop_must_meet():
    """eval.md's definition names the length floor too: an answer ending in five repeats of one word (as the default
    run's "... -Aa -Aa -Aa -Aa -Aa") is not counted, and the sentence must say why."""
    from distill.evaluation.evaluator import repetition_lines

    answers = ["It depends on the way it affects. -Aa -Aa -Aa -Aa -Aa"]
    found = repetition(answers)
    assert found["looping"] == 0
    [sentence] = [line for line in repetition_lines({"metrics": {"after": {"repetition": found}}}) if line]
    assert "up to 8 words repeated at least 3 times to its end, over 6 words or more" in sentence
    assert "after 0/1 looping" in sentence
