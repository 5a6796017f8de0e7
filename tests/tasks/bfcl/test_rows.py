"""BFCL entries become distill rows that distill's own loader accepts: the prompt, the tools as JSON Schema, the
reference calls as the completion, the BFCL column the scorer and the environment read; the same rows with the
tools in the prompt train the same ids under a template without tool support (SmolLM2's, the default model's).

Hand-made entries follow BFCL's file format (one JSON object a line, answers joined by id under possible_answer/);
the real ones are the installed bfcl-eval package's (Apache-2.0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import datasets
import pytest

from distill.conversations.tool_calls import parse_tool_calls
from distill.data import examples_from_dataset
from distill.rendering import TextRenderer
from distill.tasks.bfcl.backends import Scenario
from distill.tasks.bfcl.rows import category_rows, entries, installed_data_dir, reference_calls
from distill.tasks.bfcl.scoring import AstTask, decoded_calls, score_calls

TRIANGLE = {"name": "geometry.triangle_area", "description": "Area of a triangle.", "parameters": {
    "type": "dict", "required": ["base", "height"], "properties": {
        "base": {"type": "integer", "description": "the base"}, "height": {"type": "float", "description": "the height"},
        "unit": {"type": "string", "description": "the unit"},
        "options": {"type": "dict", "properties": {"exact": {"type": "boolean"}, "digits": {"type": "integer"}}}}}}
CIRCLE = {"name": "geometry.circle_area", "description": "Area of a circle.", "parameters": {
    "type": "dict", "required": ["radius"], "properties": {"radius": {"type": "float", "description": "the radius"}}}}
QUESTION = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Area of a triangle, base 10, height 5?"}]]
ANSWER = [{"geometry.triangle_area": {"base": [10], "height": [5.0, 5], "unit": ["units", ""],
                                      "options": [{"exact": [True], "digits": [2, ""]}]}}]


def write_category(folder: Path, category: str, rows: list[dict], answers: list[dict]) -> Path:
    (folder / "possible_answer").mkdir(parents=True, exist_ok=True)
    (folder / f"BFCL_v4_{category}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "possible_answer" / f"BFCL_v4_{category}.json").write_text("".join(json.dumps(a) + "\n" for a in answers))
    return folder


def test_a_single_turn_entry_becomes_a_row_distill_loads(tmp_path):
    write_category(tmp_path, "multiple", [{"id": "multiple_7", "question": QUESTION, "function": [CIRCLE, TRIANGLE]}],
                   [{"id": "multiple_7", "ground_truth": ANSWER}])
    (row,) = category_rows(tmp_path, "multiple")
    assert row["id"] == "multiple_7" and row["prompt"] == QUESTION[0]
    tools = json.loads(row["tools"])
    assert [t["function"]["name"] for t in tools] == ["geometry.circle_area", "geometry.triangle_area"]
    assert tools[1]["function"]["parameters"]["properties"]["height"]["type"] == "number"
    (call,) = row["completion"][0]["tool_calls"]
    # the first accepted value of each argument; the optional unit left out; the dict's optional key left out
    assert json.loads(call["function"]["arguments"]) == {"base": 10, "height": 5.0, "options": {"exact": True}}
    assert json.loads(row["bfcl"]) == {"id": "multiple_7", "category": "multiple", "functions": [CIRCLE, TRIANGLE],
                                       "answer": ANSWER}
    (example,) = examples_from_dataset(datasets.Dataset.from_list([row]), "dataset")
    assert example.tools == tools and example.turns == row["completion"] and example.row["bfcl"] == row["bfcl"]
    reference = [{c["function"]["name"]: json.loads(c["function"]["arguments"])} for c in row["completion"][0]["tool_calls"]]
    assert score_calls(reference, AstTask.of(row)).valid


def test_the_tools_in_the_prompt_train_the_same_ids_as_the_tools_column(smol_tokenizer):
    """For a template without tool support the renderer writes the `tools` column into the system message and the
    calls into the text; `tools_in_prompt` writes the same into the row, so a method that samples can run on it."""
    data = installed_data_dir()
    column = examples_from_dataset(datasets.Dataset.from_list(category_rows(data, "multiple")[:4]), "dataset")
    in_prompt = examples_from_dataset(datasets.Dataset.from_list(category_rows(data, "multiple", True)[:4]), "dataset")
    renderer = TextRenderer(smol_tokenizer, 4096, 512, [smol_tokenizer.eos_token_id])
    for a, b in zip(column, in_prompt):
        assert b.tools is None and b.turns is None and a.tools is not None
        one, other = renderer.row(a), renderer.row(b)
        assert one.prompt_ids == other.prompt_ids
        assert [t for t, f in zip(one.completion_ids, one.completion_trained) if f] == other.completion_ids
        assert '"name": "' in smol_tokenizer.decode(other.completion_ids)
        assert decoded_calls(b.completion) == [{c.name: c.arguments} for c in parse_tool_calls(b.completion).calls]
        assert score_calls(decoded_calls(b.completion), AstTask.of(b.row)).valid


def test_a_multi_turn_entry_becomes_a_prompt_its_classes_tools_and_its_scenario(tmp_path):
    documents = [{"name": name, "description": f"{name} a thing", "parameters": {"type": "dict", "properties": {
        "folder": {"type": "string", "description": "where"}}, "required": []}, "response": {"type": "dict"}}
        for name in ("cd", "ls", "cp")]
    (tmp_path / "multi_turn_func_doc").mkdir()
    (tmp_path / "multi_turn_func_doc" / "gorilla_file_system.json").write_text("".join(json.dumps(d) + "\n" for d in documents))
    config = {"GorillaFileSystem": {"root": {"me": {"type": "directory", "contents": {}}}}}
    entry = {"id": "multi_turn_base_9", "question": [[{"role": "user", "content": "Go to docs."}],
                                                     [{"role": "user", "content": "List it."}]],
             "initial_config": config, "involved_classes": ["GorillaFileSystem"], "excluded_function": ["cp"], "path": []}
    write_category(tmp_path, "multi_turn_base", [entry], [{"id": "multi_turn_base_9", "ground_truth": [["cd(folder='docs')"],
                                                                                                      ["ls()"]]}])
    (row,) = category_rows(tmp_path, "multi_turn_base")
    assert row["prompt"] == [{"role": "user", "content": "Go to docs.\n\nList it."}] and "completion" not in row
    assert [t["function"]["name"] for t in json.loads(row["tools"])] == ["cd", "ls"]  # cp is excluded
    scenario = Scenario.of(row["bfcl"])
    assert scenario.involved_classes == ("GorillaFileSystem",) and scenario.initial_config == config
    assert scenario.excluded_functions == {"cp"} and scenario.ground_truth == (("cd(folder='docs')",), ("ls()",))
    examples_from_dataset(datasets.Dataset.from_list([row]), "dataset")


def test_every_real_entry_of_the_loaded_categories_has_its_answer_and_loads():
    data = installed_data_dir()
    for category, count in (("simple_python", 400), ("multiple", 200), ("multi_turn_base", 200)):
        rows = category_rows(data, category)
        assert len(rows) == count == len({row["id"] for row in rows})
        examples = examples_from_dataset(datasets.Dataset.from_list(rows), "dataset")
        assert all(example.tools for example in examples)


def test_bad_data_is_refused_naming_the_entry_and_the_fix(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="category 'java' is not supported"):
        entries(tmp_path, "java")
    with pytest.raises(ValueError, match="BFCL_v4_simple_python.json does not exist"):
        entries(tmp_path, "simple_python")
    write_category(tmp_path, "simple_python", [{"id": "simple_python_3", "question": QUESTION, "function": [TRIANGLE]}], [])
    with pytest.raises(ValueError, match=r"entries \['simple_python_3'\] have no ground truth"):
        entries(tmp_path, "simple_python")
    monkeypatch.setitem(sys.modules, "bfcl_eval", None)
    with pytest.raises(ValueError, match=r"pip install --no-deps bfcl-eval==2026\.3\.23"):
        installed_data_dir()


def test_reference_calls_give_each_expected_call_its_first_accepted_values():
    answer = [{"geometry.circle_area": {"radius": ["", 2.0]}}, {"geometry.triangle_area": {"base": [3], "height": [1.5]}}]
    calls = reference_calls([CIRCLE, TRIANGLE], answer)
    assert [(c.name, c.arguments) for c in calls] == [("geometry.circle_area", {"radius": 2.0}),  # required: kept
                                                      ("geometry.triangle_area", {"base": 3, "height": 1.5})]
