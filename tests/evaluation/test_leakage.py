"""Template leakage: greedy answers that repeat five or more words of a self-teacher's prompt template."""

from __future__ import annotations

from distill.evaluation.leakage import leaked_run, template_leakage, template_runs
from distill.methods import get_method
from distill.methods.self_teacher_prompts import DEFAULT_TEACHER_PROMPT_TEMPLATE

TEMPLATE = DEFAULT_TEACHER_PROMPT_TEMPLATE  # "{prompt}\n\nThis is an example for a response to the question:\n..."


def test_runs_are_the_templates_literal_words_never_spanning_a_placeholder():
    runs = template_runs(("{prompt} one two three four {privileged_context} five six seven eight nine",))
    assert runs == {("five", "six", "seven", "eight", "nine")}  # "one .. four" is 4 words; nothing spans {…}
    assert ("braces", "stay", "text", "here", "ok") in template_runs(("{{braces}} stay text here ok",))


def test_an_answer_leaks_when_it_repeats_a_run_the_question_does_not_hold():
    runs = template_runs((TEMPLATE,))
    leaked = "This is an example for a response to the question: Harralwick."
    assert leaked_run(leaked, "Which city is the capital of Zelpelesh?", runs) == ("this", "is", "an", "example", "for")
    assert leaked_run("The capital of Zelpelesh is Harralwick.", "Which city is the capital?", runs) is None
    # The same words in the question are the question's, not the template's.
    question = "Write this is an example for a response to the question: a haiku."
    assert leaked_run(leaked, question, runs) is None
    assert leaked_run("an example for a", "q", runs) is None  # four words are not a run


def test_the_fraction_counts_answers_and_keeps_one_example():
    result = template_leakage(["This is an example for a response", "Paris.", "now answer with a response of your own"],
                              ["q1", "q2", "q3"], (TEMPLATE,))
    assert result == {"leaked": 2, "answers": 3, "fraction": 2 / 3, "example": "this is an example for"}
    assert template_leakage([], [], (TEMPLATE,))["fraction"] == 0.0


def test_the_self_distillation_methods_and_their_baselines_name_their_templates():
    assert get_method("sdft").template_fields == ("teacher_prompt_template",)
    assert get_method("sft").template_fields == ("teacher_prompt_template",)  # sdft's: the comparison it is the baseline of
    assert get_method("sdpo").template_fields == ("reprompt_template", "solution_template", "feedback_template")
    assert get_method("gkd").template_fields == ()
