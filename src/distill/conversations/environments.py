"""Environments: the tools of a rollout bound to state of its own, made for each rollout row.

The reference library's contract (its `environment_factory`): `environment` names a factory by import path
('package.module:Factory', a class or a function taking no argument). One instance is made per rollout row;
`reset(**row)` (required) is called with the row's columns before the first turn and returns None or text, which is
appended to the row's last user message (an observation: the task's start); the instance's public methods are that
row's tools, beside the run's `tools`. A fresh instance per rollout means its state is rebuilt from the row: a
resumed run makes the same environments again, nothing of theirs is checkpointed.

An environment that defines `get_reward()` (no argument; a number; may be `async`) owns a reward: it is called once
per finished conversation, on that row's instance, and grpo / sdpo add it to `reward_funcs` with weight 1 (logged as
`reward/environment/mean`; `reward_funcs` may then be empty). It raising, or returning something that is not a finite
number, stops the run naming the environment (a `RewardFunctionError`, as a reward function's failure does).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

from distill.callables import import_callable
from distill.conversations.tools import Tool, ToolRunner, tool_schema
from distill.errors import RewardFunctionError


def _methods(instance: Any) -> dict[str, Callable[..., Any]]:
    """The instance's public methods (listed on its class, so properties are not evaluated), `reset` aside."""
    names = [name for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
             if not name.startswith("_") and name not in ("reset", "get_reward")]
    return {name: getattr(instance, name) for name in names}


@dataclass(frozen=True)
class EnvironmentFactory:
    """`environment`'s factory, probed once: its tools' schemas (shown in every prompt) and its `reset`."""

    spec: str
    factory: Callable[[], Any]
    schemas: tuple[dict[str, Any], ...]
    owns_reward: bool = False  # it defines get_reward()

    @classmethod
    def load(cls, spec: str, tool_names: set[str]) -> "EnvironmentFactory":
        """ValueError naming `environment` when the factory does not resolve, its instance has no `reset`, or one of its
        methods is named like one of the run's `tools`."""
        factory = import_callable(spec, "environment")
        try:
            probe = factory()
        except Exception as error:
            raise ValueError(f"environment: {spec}() raised {type(error).__name__}: {error}") from None
        if not callable(getattr(probe, "reset", None)):
            raise ValueError(f"environment: {spec}() made a {type(probe).__name__} without a `reset` method; an "
                             "environment defines reset(**row) (returning None, or text shown after the prompt)")
        methods = _methods(probe)
        clash = sorted(set(methods) & tool_names)
        if clash:
            raise ValueError(f"environment: {spec}'s methods {clash} are named like tools in `tools`; rename one")
        if not methods:
            raise ValueError(f"environment: {spec}() has no public methods, so the model has no tool to call")
        return cls(spec, factory, tuple(tool_schema(method) for method in methods.values()),
                   callable(getattr(probe, "get_reward", None)))

    def reward(self, instance: Any, row_index: int) -> float:
        """`instance.get_reward()` (awaited when async), checked to be a finite number."""
        try:
            value = instance.get_reward()
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
        except Exception as error:
            raise RewardFunctionError(f"environment: {self.spec}.get_reward raised {type(error).__name__}: {error} (dataset "
                                      f"row {row_index})") from error
        number = float(value) if isinstance(value, numbers.Real) else None
        if number is None or not math.isfinite(number):
            raise RewardFunctionError(f"environment: {self.spec}.get_reward returned {value!r} for dataset row {row_index}; "
                                      "it returns a finite number")
        return number

    def make(self, row: dict[str, Any], shared: dict[str, Tool], timeout: float) -> tuple[ToolRunner, str | None, Any]:
        """A row's environment: the runner of its tools (the shared ones and its own methods), what `reset` said, and
        the instance (its `get_reward` is asked at the end)."""
        instance = self.factory()
        try:
            observation = instance.reset(**row)
        except Exception as error:
            raise ValueError(f"environment: {self.spec}.reset raised {type(error).__name__}: {error} (called with the row's "
                             f"columns {sorted(row)})") from None
        if observation is not None and not isinstance(observation, str):
            raise ValueError(f"environment: {self.spec}.reset returned {type(observation).__name__}; it returns None or "
                             "text")
        own = {name: Tool(name, method, tool_schema(method)) for name, method in _methods(instance).items()}
        return ToolRunner({**shared, **own}, timeout), observation, instance


async def _awaited(value):
    return await value
