"""BFCL's multi-turn back-ends as a distill environment: loaded by import path as any environment is, reset from a
row's initial configuration, its methods the tools (BFCL's documents naming them), and a ground-truth trajectory
replayed through distill's tool-call loop, as a model's turns, reaching the state BFCL's own executor reaches.

The rows are the installed bfcl-eval package's multi_turn_base (Apache-2.0).
"""

from __future__ import annotations

import inspect
import itertools
import json

import datasets
import pytest

from distill.agents.loop import LoopSettings, ToolLoop
from distill.conversations.calls import ToolCalls
from distill.conversations.environments import EnvironmentFactory
from distill.conversations.tool_calls import ToolCall, render_tool_calls
from distill.data import examples_from_dataset
from distill.generation.sample import Sample
from distill.rendering import ConversationRenderer, EnvironmentTurns, TextRenderer
from distill.tasks.bfcl.backends import (
    CLASSES,
    Scenario,
    backend_class,
    fresh_backends,
    parse_call,
    public_methods,
    run_ground_truth,
    state_differences,
)
from distill.tasks.bfcl.environment import multi_turn
from distill.tasks.bfcl.rows import category_rows, function_documents, installed_data_dir

SPEC = "distill.tasks.bfcl.environment:multi_turn"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return category_rows(installed_data_dir(), "multi_turn_base")


def bfcl_executor_state(scenario: Scenario, run_name: str) -> dict:
    """The back-ends after BFCL's own executor ran the ground truth, turn by turn (its code: eval of the strings)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    instances: dict = {}
    for turn in scenario.ground_truth:
        _, instances = execute_multi_turn_func_call(list(turn), scenario.initial_config, list(scenario.involved_classes),
                                                    run_name, scenario.id, long_context=scenario.long_context)
    return instances


def test_the_factory_is_an_environment_whose_tools_are_the_back_ends_methods_bfcls_documents_name():
    factory = EnvironmentFactory.load(SPEC, set())
    methods = {name: (cls, function) for cls in CLASSES for name, function in public_methods(backend_class(cls)).items()}
    assert factory.owns_reward and sorted(s["function"]["name"] for s in factory.schemas) == sorted(methods)
    assert len(methods) == sum(len(public_methods(backend_class(cls))) for cls in CLASSES)  # no two share a name
    for cls in CLASSES:
        for document in function_documents(installed_data_dir(), cls):
            owner, function = methods[document["name"]]
            assert owner == cls
            assert set(document["parameters"]["properties"]) <= set(inspect.signature(function).parameters) - {"self"}


def test_reset_loads_the_rows_configuration_and_the_tools_answer_as_text(rows):
    row = rows[0]  # GorillaFileSystem and TwitterAPI; `cp` excluded
    environment = multi_turn()
    assert environment.reset(**row) is None and sorted(environment.backends) == ["GorillaFileSystem", "TwitterAPI"]
    assert not state_differences(environment.backends, fresh_backends(Scenario.of(row["bfcl"])))
    calls = ToolCalls({}, EnvironmentFactory.load(SPEC, set()), 5.0, workers=1)
    try:  # as a run calls it: made and reset in a tool worker, its methods the row's tools
        conversations = calls.open([row, row], [0, 1])
        listing, excluded, elsewhere, bad, moved = conversations.run([
            (0, ToolCall("ls", {})), (0, ToolCall("cp", {"source": "a", "destination": "b"})),
            (0, ToolCall("add", {"a": 1, "b": 2})), (0, ToolCall("ls", {"nope": 1})), (1, ToolCall("cd", {"folder": "document"}))])
        [after_cd_elsewhere] = conversations.run([(0, ToolCall("pwd", {}))])
        conversations.close()
    finally:
        calls.close()
    assert listing.failure is None and json.loads(listing.content) == {"current_directory_content": ["document", "archive"]}
    assert excluded.failure == "raised" and "cp is not available in this task" in excluded.content
    assert elsewhere.failure == "raised" and "add belongs to MathAPI, which this task does not use" in elsewhere.content
    # the adapter binds the arguments itself, so a wrong one is an error raised inside the method
    assert bad.failure == "raised" and "nope" in bad.content and moved.failure is None
    assert after_cd_elsewhere.failure is None and "document" not in after_cd_elsewhere.content  # each row's own state


def test_a_row_without_a_scenario_is_refused_naming_the_column():
    with pytest.raises(ValueError, match="the row has no 'bfcl' column"):
        multi_turn().reset(prompt="x")
    with pytest.raises(ValueError, match="holds no multi-turn scenario"):
        multi_turn().reset(bfcl=json.dumps({"id": "simple_python_0", "functions": []}))


@pytest.mark.parametrize("category", ["multi_turn_base", "multi_turn_long_context"])
def test_every_ground_truth_call_parses_and_runs_to_the_state_bfcls_executor_reaches(category):
    rows, changed = category_rows(installed_data_dir(), category), 0
    for row in rows:
        scenario = Scenario.of(row["bfcl"])
        assert scenario.long_context == (category == "multi_turn_long_context")
        mine = run_ground_truth(scenario)
        assert not state_differences(mine, bfcl_executor_state(scenario, f"distill_twin_{category}")), row["id"]
        changed += bool(state_differences(mine, fresh_backends(scenario)))
    assert len(rows) == 200 and changed > 150  # the ground truth changes the state of most rows


def script_of(scenario: Scenario, turns: int | None = None) -> list[str]:
    """A model's turns replaying the ground truth: one call a turn (calls given together would run at once, and
    their order matters), then an answer; `turns`: only the first user turns' calls."""
    backends = fresh_backends(scenario)
    texts = []
    for text in itertools.chain.from_iterable(scenario.ground_truth[:turns]):
        call = parse_call(text, backends)
        texts.append(render_tool_calls([ToolCall(call.name, json.loads(json.dumps(call.arguments)))]))
    return texts + ["Done."]


def replay(rows: list[dict], scripts: list[list[str]], tokenizer):
    """The rows through distill's tool loop (`ToolLoop.run`: the environment made and reset per row in a tool worker,
    its reward asked at the end: 1.0 when the back-ends' end state is the ground truth's), the model's turns
    scripted; the trajectories."""
    eos = [tokenizer.eos_token_id]
    renderer = TextRenderer(tokenizer, 16384, 60000, eos)
    examples = examples_from_dataset(datasets.Dataset.from_list(rows), "dataset")
    prompts = [renderer.prompt(example).ids for example in examples]

    def generate(batch, max_new_tokens, turn, indices):
        return [Sample(tokenizer(scripts[i][turn], add_special_tokens=False)["input_ids"] + eos, False, None)
                for i in indices]

    loop = ToolLoop(ToolCalls({}, EnvironmentFactory.load(SPEC, set()), 10.0, workers=1),
                    EnvironmentTurns(tokenizer, ConversationRenderer(tokenizer, eos), eos),
                    lambda ids: tokenizer.decode(ids), LoopSettings(max(map(len, scripts)), 60000), renderer)
    try:
        trajectories, followed = loop.run(generate, prompts, examples, eos)
    finally:
        loop.close()
    assert followed == prompts  # reset says nothing: the prompt is the row's
    return trajectories


def covering(rows: list[dict]) -> list[dict]:
    """Rows whose classes cover every back-end, and a call with a positional argument."""
    chosen, seen = [], set()
    for row in rows:
        task = json.loads(row["bfcl"])
        if set(task["involved_classes"]) - seen:
            chosen.append(row)
            seen |= set(task["involved_classes"])
    assert seen == set(CLASSES) and any("('" in call for row in chosen for turn in json.loads(row["bfcl"])["answer"]
                                        for call in turn)
    return chosen


def test_a_replayed_ground_truth_reaches_the_ground_truth_state_through_the_tool_loop(rows, smol_tokenizer):
    """The reward is the end state compared with the ground truth's (`run_ground_truth`, itself equal to BFCL's
    executor's: the test above), asked of each row's instance in its worker."""
    chosen = covering(rows)
    scenarios = [Scenario.of(row["bfcl"]) for row in chosen]
    scripts = [script_of(scenario) for scenario in scenarios]
    trajectories = replay(chosen, scripts, smol_tokenizer)
    for row, script, trajectory in zip(chosen, scripts, trajectories):
        assert trajectory.turns == len(script) and trajectory.calls == len(script) - 1 and not trajectory.hit_max
        assert sum(trajectory.failures.values()) == 0, (row["id"], trajectory.failures)
        assert trajectory.reward == 1.0, row["id"]
    assert any(state_differences(run_ground_truth(s), fresh_backends(s)) for s in scenarios)
    environment = multi_turn()  # the reward's own rule, in this process: the end state of the replayed calls
    environment.reset(**chosen[0])
    for text in itertools.chain.from_iterable(scenarios[0].ground_truth):
        call = parse_call(text, environment.backends)
        getattr(environment, call.name)(**call.arguments)
    assert environment.get_reward() == 1.0
    assert not state_differences(environment.backends, bfcl_executor_state(scenarios[0], "distill_twin_replay"))


def test_a_trajectory_that_stops_after_the_first_request_is_rewarded_zero(rows, smol_tokenizer):
    row = rows[0]
    scenario = Scenario.of(row["bfcl"])
    (trajectory,) = replay([row], [script_of(scenario, turns=1)], smol_tokenizer)
    assert trajectory.turns == len(script_of(scenario, turns=1)) and trajectory.reward == 0.0


@pytest.mark.parametrize("text, match", [("cd(folder=", "does not parse"), ("os.system('ls')", "not a call of a function by name"),
                                         ("rm_everything()", "no back-end of the row"), ("cd(folder=open('x'))", "not a literal"),
                                         ("cd('a', 'b')", "too many positional arguments")])
def test_a_ground_truth_call_that_is_not_a_literal_call_of_a_method_is_refused_not_run(rows, text, match):
    with pytest.raises(ValueError, match=match):
        parse_call(text, fresh_backends(Scenario.of(rows[0]["bfcl"])))
