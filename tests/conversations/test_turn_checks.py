"""A dataset conversation's turns checked as it loads (`distill.conversations.turn_checks`): a trained assistant turn
with neither text nor calls is refused, and a `tool_call_id` must answer a call of the assistant turn before it, each
refusal naming the row and the message; rows that are fine load as before."""

from __future__ import annotations

import json

import pytest

from distill.data import examples_from_dataset
from distill.data_files import load_dataset_spec
from tests.conversations.test_render import TOOLS, call
from tests.helpers.training import forbid_model_loading

USER = {"role": "user", "content": "What is 17 * 23?"}
EMPTY = "an assistant turn with neither text nor tool calls would be trained as 'end your turn at once'"


def load(*rows: dict, folder):
    """The rows as a run loads them from a JSONL file (the columns of every row; absent keys filled with nulls)."""
    path = folder / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return examples_from_dataset(load_dataset_spec(str(path), "train", "dataset"), "dataset")


def refused(row: dict, match: str, folder) -> None:
    with pytest.raises(ValueError, match=match):
        load({"prompt": [USER], "completion": "fine"}, row, folder=folder)  # the bad row second: it names row 1


def with_id(name: str, id_: str, **arguments) -> dict:
    return {"id": id_, **call(name, **arguments)}


@pytest.mark.parametrize("row, message", [
    ({"messages": [USER, {"role": "assistant", "content": ""}]}, "message 1"),
    ({"messages": [USER, {"role": "assistant", "content": " \n"}]}, "message 1"),  # whitespace says nothing either
    ({"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [call("calc", expr="17*23")]},
                   {"role": "tool", "name": "calc", "content": "391"}, {"role": "assistant", "content": ""}],
      "tools": TOOLS}, "message 3"),  # the last turn of a conversation
    ({"prompt": [USER], "completion": [{"role": "assistant", "content": ""}]}, "message 1"),
    ({"prompt": "What is 17 * 23?", "completion": [{"role": "assistant", "content": ""}]}, "'completion' message 0"),
    ({"prompt": [USER], "completion": ""}, "'completion'"),
])
def test_a_trained_assistant_turn_with_neither_text_nor_calls_is_refused(tmp_path, row, message):
    refused(row, rf"dataset row 1 {message}: {EMPTY}; give the turn its text or its 'tool_calls', or leave it out",
            tmp_path)


def test_turns_that_say_something_or_are_only_shown_still_load(tmp_path):
    calls_only = {"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [call("calc", expr="17*23")]},
                               {"role": "tool", "name": "calc", "content": "391"},
                               {"role": "assistant", "content": "391."}], "tools": TOOLS}
    shown = {"prompt": [USER, {"role": "assistant", "content": ""}, {"role": "user", "content": "Again?"}],
             "completion": "391."}  # an empty turn in the prompt is shown, never trained
    examples = load(calls_only, shown, folder=tmp_path)
    assert len(examples[0].turns) == 3 and examples[1].completion == "391."


def _answered(*ids: str | None, call_ids: tuple[str, str] | None = ("call_a", "call_b")) -> dict:
    calls = [call("calc", expr="1+1"), call("calc", expr="2+2")]
    if call_ids is not None:
        calls = [{"id": id_, **c} for id_, c in zip(call_ids, calls)]
    answers = [{"role": "tool", "name": "calc", "content": str(2 * (k + 1)), **({"tool_call_id": id_} if id_ else {})}
               for k, id_ in enumerate(ids)]
    return {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": calls}, *answers,
                         {"role": "assistant", "content": "2 and 4."}], "tools": TOOLS}


def test_a_tool_call_id_that_answers_no_call_of_the_turn_before_is_refused(tmp_path):
    refused(_answered("call_a", "call_z"), r"dataset row 1 message 3: its tool_call_id 'call_z' answers no call of the "
                                           r"assistant turn before it \(message 1, whose calls have the ids "
                                           r"\['call_a', 'call_b'\]\)", tmp_path)
    refused(_answered("call_b", "call_b"), r"dataset row 1 message 3: its tool_call_id 'call_b' answers a call that "
                                           r"message 2 answered already", tmp_path)
    # An id of an earlier turn's call answers nothing of this turn's.
    earlier = _answered("call_a", "call_b")
    earlier["messages"][-1:] = [{"role": "assistant", "content": "", "tool_calls": [with_id("calc", "call_c", expr="3")]},
                                {"role": "tool", "name": "calc", "content": "3", "tool_call_id": "call_a"},
                                {"role": "assistant", "content": "3."}]
    refused(earlier, r"message 5: its tool_call_id 'call_a' answers no call of the assistant turn before it "
                     r"\(message 4, whose calls have the ids \['call_c'\]\)", tmp_path)


def test_tool_call_ids_that_answer_their_calls_load_in_any_order_and_rows_without_ids_match_by_position(tmp_path):
    examples = load(_answered("call_b", "call_a"), _answered(None, None), _answered("x", "y", call_ids=None),
                    _answered("call_a", None), folder=tmp_path)
    assert [len(e.turns) for e in examples] == [4, 4, 4, 4]


def test_the_refusal_comes_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from distill.cli import main

    forbid_model_loading(monkeypatch, "a model was loaded before the rows were checked", resolving=True)
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(_answered("call_a", "call_q")) + "\n")
    assert main(["train", "--dataset", str(data), "--output_dir", str(tmp_path / "run"), "--method", "sft"]) == 2
    err = capsys.readouterr().err
    assert "dataset row 0 message 3: its tool_call_id 'call_q' answers no call" in err
    assert not (tmp_path / "run").exists()
