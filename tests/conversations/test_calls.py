"""Where a conversation's calls run (`distill.conversations.calls`): an environment's instance lives in one tool worker
for its whole conversation (made, reset, called and asked for its reward there); a worker that ends mid-conversation
stops the step naming the environment, what ended it and the row; a plain tool's failure never costs an environment;
the stand-in `distill doctor` times a step with runs nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from distill.conversations.calls import STAND_IN, ToolCalls
from distill.conversations.environments import EnvironmentFactory
from distill.conversations.tool_calls import ToolCall
from distill.conversations.tools import load_tools
from distill.errors import EnvironmentLost, StepFailure
from tests.conversations.toolbox import tool_worker_pids

TOOLBOX = "tests.conversations.toolbox"


def calls_with(environment: str | None, tools=(), timeout: float = 5.0, workers: int = 2) -> ToolCalls:
    shared = load_tools([f"{TOOLBOX}:{name}" for name in tools])
    factory = EnvironmentFactory.load(f"{TOOLBOX}:{environment}", set(shared)) if environment else None
    return ToolCalls(shared, factory, timeout, workers)


def texts(results) -> list[str]:
    return [result.content for result in results]


@pytest.fixture
def fragile():
    made = calls_with("Fragile", tools=("spin", "add"), timeout=1.0)
    yield made
    made.close()


def test_an_environment_lives_in_one_worker_for_its_whole_conversation(fragile):
    conversations = fragile.open([{}] * 4, [10, 11, 12, 13])
    assert conversations.observations == [None] * 4
    first = [int(text) for text in texts(conversations.run([(row, ToolCall("where", {})) for row in range(4)]))]
    for _ in range(3):
        conversations.run([(row, ToolCall("step", {})) for row in range(4)])
    again = [int(text) for text in texts(conversations.run([(row, ToolCall("where", {})) for row in range(4)]))]
    assert first == again and os.getpid() not in first and len(set(first)) == 2  # rows spread over 2 hosts, kept
    assert texts(conversations.run([(row, ToolCall("step", {})) for row in range(4)])) == ["4"] * 4  # each its own state
    conversations.close()


@pytest.mark.timeout(60)
def test_a_plain_tools_failure_never_costs_an_environment(fragile):
    conversations = fragile.open([{}] * 2, [0, 1])
    conversations.run([(0, ToolCall("step", {}))])
    results = conversations.run([(0, ToolCall("spin", {})), (1, ToolCall("add", {"a": 1, "b": 2})),
                                 (0, ToolCall("step", {})), (1, ToolCall("nope", {}))])
    assert [r.failure for r in results] == ["timeout", None, None, "unknown_tool"]
    assert texts(results)[1:3] == ["3", "2"]  # the environment kept its count through the tool's timeout
    assert "the tools are: add, crash, leave, spin, stall, step, where" in results[3].content
    conversations.close()


def test_sys_exit_in_an_environment_is_a_failed_call_that_keeps_the_instance(fragile):
    conversations = fragile.open([{}], [0])
    left = conversations.run([(0, ToolCall("step", {})), (0, ToolCall("leave", {}))])
    assert left[1].failure == "exited" and "sys.exit(0)" in left[1].content
    assert texts(conversations.run([(0, ToolCall("step", {}))])) == ["2"]
    conversations.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method, says", [
    ("crash", "Fragile.crash exited before returning a result (the process exited with status 9) (dataset row 21)"),
    ("stall", "Fragile.stall took longer than 1 s and was stopped (dataset row 21)"),
])
def test_a_worker_that_ends_mid_conversation_stops_the_step_naming_the_environment(fragile, method, says):
    conversations = fragile.open([{}] * 4, [20, 21, 22, 23])
    conversations.run([(row, ToolCall("step", {})) for row in range(4)])
    with pytest.raises(EnvironmentLost, match="holding 2 of the step's environment instances ended") as raised:
        conversations.run([(1, ToolCall(method, {})), (0, ToolCall("step", {}))])
    assert isinstance(raised.value, StepFailure) and says in str(raised.value)
    assert "raise tool_timeout" in str(raised.value)
    assert fragile.pool.pids() == []  # every instance of the batch went with the pool
    fresh = fragile.open([{}], [0])  # the next batch starts afresh
    assert texts(fresh.run([(0, ToolCall("step", {}))])) == ["1"]
    fresh.close()


def test_reset_runs_in_the_worker_and_its_failure_names_the_environment(tmp_path):
    adder = calls_with("Adder")
    try:
        conversations = adder.open([{"answer": "5"}, {"answer": "9"}], [0, 1])
        assert conversations.observations == [" (the numbers are 2 and 3)", " (the numbers are 2 and 7)"]
        assert texts(conversations.run([(1, ToolCall("plus", {"a": 2, "b": 7}))])) == ["9"]
        assert conversations.rewards() == [0.0, 1.0]
        with pytest.raises(ValueError, match=r"environment: tests.conversations.toolbox:Adder.reset raised KeyError: "
                                             r"'answer' \(called with the row's columns \['question'\]\)"):
            adder.open([{"question": "?"}], [0])
    finally:
        adder.close()


def test_the_stand_in_answers_every_call_and_runs_nothing(tmp_path):
    marker = tmp_path / "marker"
    calls = calls_with("Adder", tools=("write_marker",))
    with calls.standing_in():
        conversations = calls.open([{"answer": "5"}], [0])  # no reset: the row has no observation
        results = conversations.run([(0, ToolCall("write_marker", {"path": str(marker)})),
                                     (0, ToolCall("plus", {"a": 1, "b": 2})), (0, ToolCall("nope", {}))])
        assert texts(results)[:2] == [STAND_IN, STAND_IN] and results[2].failure == "unknown_tool"
        assert conversations.observations == [None] and conversations.rewards() == [0.0]
        conversations.close()
    assert not marker.exists() and calls.pool.pids() == []  # no worker even started
    conversations = calls.open([{"answer": "5"}], [0])  # outside: the tools run
    assert texts(conversations.run([(0, ToolCall("write_marker", {"path": str(marker)}))])) == ["written"]
    assert Path(marker).read_text() == "a tool ran"
    calls.close()
    assert not set(tool_worker_pids()) & set(calls.pool.pids())


def test_a_class_factory_is_read_for_its_schemas_without_being_made():
    factory = EnvironmentFactory.load(f"{TOOLBOX}:Adder", set())
    assert [schema["function"]["name"] for schema in factory.schemas] == ["plus"] and factory.owns_reward
    assert list(factory.schemas[0]["function"]["parameters"]["properties"]) == ["a", "b"]  # bound: no `self`
