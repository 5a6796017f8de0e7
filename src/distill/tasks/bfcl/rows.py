"""BFCL entries as distill rows.

BFCL's files (`BFCL_v4_<category>.json`, JSON Lines despite the name) hold one entry per line: an `id`, `question`
(a list of user turns, each a list of messages) and, for the single-turn categories, `function` (the function
documents the model is offered); `possible_answer/BFCL_v4_<category>.json` holds each id's `ground_truth`, joined by
id. A single-turn entry (simple_python, multiple, parallel, parallel_multiple and their live_ versions) becomes:

    {"id": ..., "prompt": [the turn's messages], "tools": JSON text of the JSON-schema tools,
     "completion": [{"role": "assistant", "content": "", "tool_calls": [the reference calls]}],
     "bfcl": JSON text {"id", "category", "functions": BFCL's documents, "answer": the ground truth}}

The reference calls (what `sft` trains on) give each argument the first value its answer accepts, and leave out an
optional one (its accepted values hold "") unless the function requires it. With `tools_in_prompt`, the row carries
no `tools` column: the schemas are written into its system message and the calls into the completion's text, as
distill renders them for a chat template without tool support (`distill.conversations.tool_calls`), so that methods
that sample run on the rows without a tool to execute the calls. A multi-turn entry (multi_turn_base,
multi_turn_long_context) becomes a prompt of one user message (its turns' requests, in order, separated by blank
lines), the `tools` of its classes' BFCL documents without its excluded functions, and a `bfcl` column holding its
scenario (`backends.Scenario`) for the environment (`environment.py`); it has no completion.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from distill.conversations.tool_calls import ToolCall, tools_system_text, with_calls_in_text
from distill.tasks.bfcl.backends import CLASSES, INSTALL
from distill.tasks.bfcl.schemas import tool_schema

AST_CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple", "live_simple", "live_multiple",
                  "live_parallel", "live_parallel_multiple")
MULTI_TURN_CATEGORIES = ("multi_turn_base", "multi_turn_long_context")


def installed_data_dir() -> Path:
    """The data folder of the installed bfcl-eval package; ValueError with the install command without it."""
    try:
        import bfcl_eval
    except ModuleNotFoundError:
        raise ValueError(f"BFCL's data comes with the package bfcl-eval: {INSTALL} (or give the folder holding "
                         "BFCL_v4_*.json)") from None
    return Path(bfcl_eval.__file__).parent / "data"


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ValueError(f"{path} does not exist; the BFCL data folder holds BFCL_v4_<category>.json and "
                         "possible_answer/")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def entries(data_dir: Path, category: str) -> list[dict[str, Any]]:
    """The category's entries, each with its `ground_truth`; ValueError for an unknown category or an entry without
    an answer."""
    if category not in (*AST_CATEGORIES, *MULTI_TURN_CATEGORIES):
        raise ValueError(f"BFCL category {category!r} is not supported; the supported ones: "
                         f"{', '.join(AST_CATEGORIES + MULTI_TURN_CATEGORIES)}")
    found = read_lines(Path(data_dir) / f"BFCL_v4_{category}.json")
    answers = {entry["id"]: entry["ground_truth"] for entry in read_lines(Path(data_dir) / "possible_answer" /
                                                                             f"BFCL_v4_{category}.json")}
    missing = [entry["id"] for entry in found if entry["id"] not in answers]
    if missing:
        raise ValueError(f"BFCL category {category}: entries {missing[:5]} have no ground truth in possible_answer/")
    return [entry | {"ground_truth": answers[entry["id"]]} for entry in found]


def reference_calls(functions: list[dict[str, Any]], answer: list[dict[str, Any]]) -> list[ToolCall]:
    """One call per expected call: the first accepted value of each argument, an optional one left out unless
    required."""
    calls = []
    for expected in answer:
        (name, accepted_by_argument), = expected.items()
        parameters = next(f["parameters"] for f in functions if f["name"] == name)
        calls.append(ToolCall(name, _reference_arguments(accepted_by_argument, parameters)))
    return calls


def _reference_arguments(accepted_by_argument: dict[str, list[Any]], parameters: dict[str, Any]) -> dict[str, Any]:
    """The first accepted value of each argument, an optional one (its accepted values hold "") left out unless
    required."""
    arguments = {}
    for argument, accepted in accepted_by_argument.items():
        given = [value for value in accepted if value != ""]
        if given and ("" not in accepted or argument in parameters.get("required", [])):
            arguments[argument] = _reference_value(given[0], parameters.get("properties", {}).get(argument, {}))
    return arguments


def _reference_value(value: Any, declared: dict[str, Any]) -> Any:
    """An accepted value as a call gives it: BFCL writes a dict argument's answer as a dict of accepted values per
    key (one level deep), and a list of dicts' as a list of such dicts."""
    if declared.get("type") == "dict" and isinstance(value, dict):
        return _first_values(value)
    if declared.get("type") in ("array", "tuple") and declared.get("items", {}).get("type") == "dict" and isinstance(value, list):
        return [_first_values(element) if isinstance(element, dict) else element for element in value]
    return value


def _first_values(accepted_by_key: dict[str, Any]) -> dict[str, Any]:
    """A dict answer's first accepted value per key; a key whose accepted values hold "" is left out."""
    return {key: next(v for v in accepted if v != "") for key, accepted in accepted_by_key.items()
            if isinstance(accepted, list) and "" not in accepted and any(v != "" for v in accepted)}


def ast_row(entry: dict[str, Any], category: str, tools_in_prompt: bool = False) -> dict[str, Any]:
    """A single-turn entry (with its `ground_truth`) as a distill row."""
    if len(entry["question"]) != 1:
        raise ValueError(f"BFCL entry {entry['id']}: a single-turn category's question has one turn, got "
                         f"{len(entry['question'])}")
    prompt = [dict(message) for message in entry["question"][0]]
    tools = [tool_schema(function) for function in entry["function"]]
    calls = reference_calls(entry["function"], entry["ground_truth"])
    bfcl = {"id": entry["id"], "category": category, "functions": entry["function"], "answer": entry["ground_truth"]}
    row: dict[str, Any] = {"id": entry["id"]}
    if tools_in_prompt:
        system = tools_system_text(tools)
        if prompt[0]["role"] == "system":
            prompt[0] = {"role": "system", "content": f"{prompt[0]['content']}\n\n{system}"}
        else:
            prompt.insert(0, {"role": "system", "content": system})
        row |= {"prompt": prompt, "completion": with_calls_in_text("", calls)}
    else:
        tool_calls = [{"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                      for c in calls]
        row |= {"prompt": prompt, "tools": json.dumps(tools),
                "completion": [{"role": "assistant", "content": "", "tool_calls": tool_calls}]}
    return row | {"bfcl": json.dumps(bfcl)}


def function_documents(data_dir: Path, class_name: str) -> list[dict[str, Any]]:
    return read_lines(Path(data_dir) / "multi_turn_func_doc" / CLASSES[class_name][1])


def multi_turn_row(entry: dict[str, Any], category: str, data_dir: Path) -> dict[str, Any]:
    """A multi-turn entry (with its `ground_truth`) as a distill row for the environment."""
    requests = []
    for turn in entry["question"]:
        if any(message["role"] != "user" for message in turn):
            raise ValueError(f"BFCL entry {entry['id']}: a turn holds a message that is not the user's")
        requests += [message["content"] for message in turn]
    excluded = set(entry.get("excluded_function", []))
    documents = [document for name in entry["involved_classes"] for document in function_documents(data_dir, name)
                 if document["name"] not in excluded]
    bfcl = {"id": entry["id"], "category": category, "involved_classes": entry["involved_classes"],
            "initial_config": entry["initial_config"], "excluded_function": sorted(excluded),
            "answer": entry["ground_truth"]}
    return {"id": entry["id"], "prompt": [{"role": "user", "content": "\n\n".join(requests)}],
            "tools": json.dumps([tool_schema(document) for document in documents]), "bfcl": json.dumps(bfcl)}


def category_rows(data_dir: Path, category: str, tools_in_prompt: bool = False) -> list[dict[str, Any]]:
    """Every entry of `category` as a distill row."""
    found = entries(data_dir, category)
    if category in MULTI_TURN_CATEGORIES:
        return [multi_turn_row(entry, category, data_dir) for entry in found]
    return [ast_row(entry, category, tools_in_prompt) for entry in found]
