"""BFCL's multi-turn back-ends: stateful Python classes (a file system, a trading bot, a travel agency, ...) that
the package `bfcl-eval` ships, made from a row's initial configuration, driven by calls, compared by state.

A row names its `involved_classes` and gives each its `initial_config`; a fresh instance of each is made and loaded
with a deep copy of its configuration (`MathAPI` is stateless and takes none), as BFCL's executor does. The ground
truth is call strings, `"mv(source='a.pdf', destination='temp')"` or with positional arguments `"sort('a.pdf')"`:
`parse_call` reads one with Python's parser (literal arguments only; nothing is evaluated) and names its positional
arguments from the method's signature. Two sets of back-ends are in the same state when every public attribute of
every instance is equal (BFCL's state check; private attributes such as a file's modification time are not state).
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

INSTALL = "pip install --no-deps bfcl-eval==2026.3.23"
BACKEND_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
# class name -> (its module under BACKEND_PACKAGE, its function documents under data/multi_turn_func_doc/)
CLASSES: dict[str, tuple[str, str]] = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
STATELESS = ("MathAPI",)


@dataclass(frozen=True)
class Scenario:
    """A multi-turn row's task: its back-ends, their initial configuration, the functions it does not offer, and
    the ground truth (call strings, a list per user turn)."""

    involved_classes: tuple[str, ...]
    initial_config: dict[str, Any]
    excluded_functions: frozenset[str] = frozenset()
    ground_truth: tuple[tuple[str, ...], ...] = ()
    long_context: bool = False
    id: str = ""

    @classmethod
    def of(cls, bfcl: Any) -> "Scenario":
        """The scenario a row's `bfcl` column holds (a mapping, or its JSON text); ValueError naming what is missing."""
        task = json.loads(bfcl) if isinstance(bfcl, str) else bfcl
        if not isinstance(task, dict) or "involved_classes" not in task or "initial_config" not in task:
            raise ValueError("the row's 'bfcl' column holds no multi-turn scenario ('involved_classes' and "
                             "'initial_config'); write the rows with `python -m distill.tasks.bfcl` from a multi_turn "
                             "category")
        unknown = sorted(set(task["involved_classes"]) - set(CLASSES))
        if unknown:
            raise ValueError(f"BFCL row {task.get('id', '?')}: back-ends {unknown} are not supported (known: {sorted(CLASSES)})")
        return cls(tuple(task["involved_classes"]), task["initial_config"], frozenset(task.get("excluded_function", ())),
                   tuple(tuple(turn) for turn in task.get("answer", ())), "long_context" in task.get("category", ""),
                   task.get("id", ""))


def backend_class(name: str) -> type:
    """The back-end class `name` (one of `CLASSES`); ModuleNotFoundError with the install command without bfcl-eval."""
    try:
        module = importlib.import_module(f"{BACKEND_PACKAGE}.{CLASSES[name][0]}")
    except ModuleNotFoundError as error:
        raise ModuleNotFoundError(f"BFCL's back-ends need the package bfcl-eval ({error}): {INSTALL}") from None
    return getattr(module, name)


def fresh_backends(scenario: Scenario) -> dict[str, Any]:
    """An instance of each of the scenario's classes, loaded with (a copy of) its initial configuration."""
    backends = {}
    for name in scenario.involved_classes:
        instance = backend_class(name)()
        if name not in STATELESS:
            instance._load_scenario(copy.deepcopy(scenario.initial_config.get(name, {})), long_context=scenario.long_context)
        backends[name] = instance
    return backends


def public_methods(cls: type) -> dict[str, Any]:
    """A back-end class's tools: its public functions, by name."""
    return {name: function for name, function in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not name.startswith("_")}


def result_text(value: Any) -> str:
    """A method's result as the model reads it: text as it is, a dict as JSON (as BFCL's executor writes it)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def parse_call(text: str, backends: dict[str, Any]) -> ParsedCall:
    """A ground-truth call string as a name and keyword arguments (positional ones named by the method's
    signature); ValueError for anything but a call of a known method with literal arguments."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"call {text!r} does not parse ({error.msg})") from None
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"{text!r} is not a call of a function by name")
    name = node.func.id
    owner = next((instance for instance in backends.values() if name in public_methods(type(instance))), None)
    if owner is None:
        raise ValueError(f"call {text!r}: no back-end of the row ({sorted(backends)}) has a method {name!r}")
    try:
        positional = [ast.literal_eval(argument) for argument in node.args]
        keywords = {keyword.arg: ast.literal_eval(keyword.value) for keyword in node.keywords if keyword.arg is not None}
    except ValueError:
        raise ValueError(f"call {text!r}: an argument is not a literal") from None
    try:
        bound = inspect.signature(getattr(owner, name)).bind(*positional, **keywords)
    except TypeError as error:
        raise ValueError(f"call {text!r}: {error}") from None
    return ParsedCall(name, dict(bound.arguments))


def run_ground_truth(scenario: Scenario) -> dict[str, Any]:
    """Fresh back-ends after every ground-truth call of every turn, in order."""
    backends = fresh_backends(scenario)
    for turn in scenario.ground_truth:
        for text in turn:
            call = parse_call(text, backends)
            owner = next(instance for instance in backends.values() if call.name in public_methods(type(instance)))
            try:
                getattr(owner, call.name)(**call.arguments)
            except Exception:  # BFCL's executor records a failing call as its error and goes on; so does this
                pass
    return backends


def state(instance: Any) -> dict[str, Any]:
    """An instance's state: its public attributes."""
    return {name: value for name, value in vars(instance).items() if not name.startswith("_")}


def state_differences(backends: dict[str, Any], expected: dict[str, Any]) -> dict[str, list[str]]:
    """Per class whose state differs from `expected`'s, the attributes that differ; {} when every state is equal."""
    differences = {}
    for name, instance in expected.items():
        mine = state(backends[name])
        differing = sorted(key for key, value in state(instance).items() if mine.get(key) != value)
        if differing:
            differences[name] = differing
    return differences
