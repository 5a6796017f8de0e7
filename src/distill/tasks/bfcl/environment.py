"""BFCL's multi-turn back-ends as a distill environment: `environment: distill.tasks.bfcl.environment:multi_turn`.

distill's environment contract (`distill.conversations.environments`): a factory named by import path makes one
instance per rollout row; `reset(**row)` is called with the row's columns; the instance's public methods are the
row's tools; `get_reward()`, when defined, is the conversation's reward. Here:

- the methods are every public method of the eight multi-turn back-ends (`backends.CLASSES`; no two share a name),
  each delegating to the row's instance of its class and returning its result as text (a dict as JSON, as BFCL's
  executor writes it). A method of a class the row does not involve, or one the row excludes, raises, which the
  model reads as the call's error;
- `reset` reads the row's `bfcl` column (`Scenario`) and makes fresh back-ends from its initial configuration;
- `get_reward` is 1.0 when every back-end's state equals the state the ground truth reaches from the same start
  (BFCL's state check, at the end of the conversation rather than after each user turn), else 0.0.

The schemas the model is shown are the row's `tools` column: BFCL's own function documents for the involved classes
(`rows.multi_turn_row`), which a row's `tools` replace the environment's for. The methods' own schemas (from the back-ends'
signatures and docstrings, `functools.wraps`) are shown only to a row without a `tools` column.

The class is built when the factory is first called, so that importing this module needs no bfcl-eval; calling it
without the package raises ModuleNotFoundError with the install command.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from distill.tasks.bfcl.backends import (
    CLASSES,
    Scenario,
    backend_class,
    fresh_backends,
    public_methods,
    result_text,
    run_ground_truth,
    state_differences,
)


class MultiTurnEnvironment:
    """The environment's base: the row's scenario and back-ends (the tools are added by `_environment_class`)."""

    def __init__(self) -> None:
        self.scenario: Scenario | None = None
        self.backends: dict[str, Any] = {}

    def reset(self, bfcl: Any = None, **row: Any) -> None:
        if bfcl is None:
            raise ValueError(f"the row has no 'bfcl' column (it has {sorted(row)}); write the rows with "
                             "`python -m distill.tasks.bfcl` from a multi_turn category")
        self.scenario = Scenario.of(bfcl)
        self.backends = fresh_backends(self.scenario)

    def get_reward(self) -> float:
        """1.0 when the back-ends are in the state the ground truth reaches, else 0.0."""
        if self.scenario is None:
            raise ValueError("get_reward before reset: the environment has no scenario")
        if not self.scenario.ground_truth:
            raise ValueError(f"BFCL row {self.scenario.id!r} has no ground truth ('answer' in its 'bfcl' column) to "
                             "compare the end state with")
        return 0.0 if state_differences(self.backends, run_ground_truth(self.scenario)) else 1.0

    def _call(self, class_name: str, method: str, arguments: dict[str, Any]) -> str:
        if self.scenario is None:
            raise ValueError(f"{method} called before reset")
        if class_name not in self.backends:
            raise ValueError(f"{method} belongs to {class_name}, which this task does not use (it uses "
                             f"{', '.join(self.scenario.involved_classes)})")
        if method in self.scenario.excluded_functions:
            raise ValueError(f"{method} is not available in this task")
        return result_text(getattr(self.backends[class_name], method)(**arguments))


def _delegate(class_name: str, method: str, original: Callable[..., Any]) -> Callable[..., str]:
    @functools.wraps(original)  # the back-end's name, docstring and signature: its schema when no `tools` column
    def call(self: MultiTurnEnvironment, **arguments: Any) -> str:
        return self._call(class_name, method, arguments)

    return call


@functools.lru_cache(maxsize=1)
def _environment_class() -> type:
    tools = {method: _delegate(name, method, function) for name in CLASSES
             for method, function in public_methods(backend_class(name)).items()}
    return type("BfclMultiTurnEnvironment", (MultiTurnEnvironment,), tools)


def multi_turn() -> MultiTurnEnvironment:
    """The environment factory (`environment: distill.tasks.bfcl.environment:multi_turn`)."""
    return _environment_class()()
