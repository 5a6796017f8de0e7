"""The calls of a generated turn scored against a BFCL row: as a reward function named by import path (grpo, sdpo)
and as the evaluation's summary; right and wrong turns, undecodable ones, rows the scorer does not judge."""

from __future__ import annotations

import json

import pytest
import torch

from distill.conversations.tool_calls import ToolCall, render_tool_calls
from distill.methods.sdpo.rewards import Rewards, load_reward_function
from distill.tasks.bfcl.scoring import calls_reward, decoded_calls, evaluate_calls
from tests.tasks.bfcl.test_checker import SPEED, TRIANGLE, TRIANGLE_ANSWER


def bfcl_row(id: str, functions: list, answer: list, category: str) -> dict:
    return {"id": id, "bfcl": json.dumps({"id": id, "category": category, "functions": functions, "answer": answer})}


ROWS = [bfcl_row("simple_python_0", [TRIANGLE], TRIANGLE_ANSWER, "simple_python"),
        bfcl_row("multiple_3", [SPEED, TRIANGLE], TRIANGLE_ANSWER, "multiple")]
RIGHT = render_tool_calls([ToolCall("calculate_triangle_area", {"base": 10, "height": 5})])
TEXTS = {
    "right": RIGHT,
    "right after some words": "Let me compute that.\n" + RIGHT,
    "a wrong value": render_tool_calls([ToolCall("calculate_triangle_area", {"base": 10, "height": 6})]),
    "two calls": render_tool_calls(2 * [ToolCall("calculate_triangle_area", {"base": 10, "height": 5})]),
    "prose": "The area is 25 square units.",
    "a call that does not parse": RIGHT + "\n<tool_call>\n{oops}\n</tool_call>",
}


@pytest.mark.parametrize("name, reward", [("right", 1.0), ("right after some words", 1.0), ("a wrong value", 0.0),
                                          ("two calls", 0.0), ("prose", 0.0), ("a call that does not parse", 0.0)])
def test_the_reward_is_one_for_a_right_turn_and_zero_otherwise(name, reward):
    assert calls_reward([[]] * 2, [TEXTS[name]] * 2, ROWS) == [reward, reward]


def test_the_reward_loads_by_import_path_with_its_range():
    function = load_reward_function("distill.tasks.bfcl.scoring:calls_reward")
    assert function.value_range == (0.0, 1.0)
    values = Rewards([function], [1.0])([[]] * 2, [TEXTS["right"], TEXTS["prose"]], ROWS, [0, 1])
    assert torch.equal(values, torch.tensor([[1.0], [0.0]], dtype=torch.float64))


def test_a_row_the_scorer_does_not_judge_is_an_error_naming_the_fix():
    multi_turn = {"bfcl": json.dumps({"id": "multi_turn_base_0", "category": "multi_turn_base", "involved_classes": [],
                                      "initial_config": {}, "answer": []})}
    for row in ({"prompt": "x"}, multi_turn):
        with pytest.raises(ValueError, match="calls_reward scores rows with a 'bfcl' column"):
            calls_reward([[]], [RIGHT], [row])


def test_the_evaluation_summary_counts_right_rows_and_errors_by_type_and_keeps_each_rows_calls():
    rows = ROWS + [{"prompt": "not a BFCL row"}, ROWS[0]]
    texts = [TEXTS["right"], TEXTS["a wrong value"], "anything", TEXTS["a call that does not parse"]]
    summary, scored = evaluate_calls(rows, texts)
    assert summary == {"correct": 1, "rows": 3, "accuracy": 1 / 3,
                       "errors": {"ast_decoder:decoder_failed": 1, "value_error:others": 1}}
    assert [entry["id"] for entry in scored] == ["simple_python_0", "multiple_3", "simple_python_0"]
    assert scored[0]["calls"] == decoded_calls(RIGHT) == [{"calculate_triangle_area": {"base": 10, "height": 5}}]
    assert scored[2]["calls"] is None and not scored[2]["valid"]
    assert evaluate_calls([{"prompt": "x"}], ["y"]) is None
