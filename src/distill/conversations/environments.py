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

The instances live in tool workers (`distill.conversations.calls`): made, reset, called and asked for their reward
there, never in the trainer. Here the factory is only read for its tools' schemas: a class is inspected without being
instantiated; a factory function is called once (in the trainer) to see what it makes.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable

from distill.callables import import_callable
from distill.conversations.tools import tool_schema
from distill.conversations.worker_process import public_methods


@dataclass(frozen=True)
class EnvironmentFactory:
    """`environment`'s factory, probed once: its tools' schemas (shown in every prompt) and its `reset`."""

    spec: str
    factory: Callable[[], Any]
    schemas: tuple[dict[str, Any], ...]
    owns_reward: bool = False  # it defines get_reward()

    @classmethod
    def load(cls, spec: str, tool_names: set[str]) -> "EnvironmentFactory":
        """ValueError naming `environment` when the factory does not resolve, what it makes has no `reset`, or one of
        its methods is named like one of the run's `tools`."""
        factory = import_callable(spec, "environment")
        if isinstance(factory, type):
            kind = factory
        else:
            try:
                kind = type(factory())
            except Exception as error:
                raise ValueError(f"environment: {spec}() raised {type(error).__name__}: {error}") from None
        if not callable(getattr(kind, "reset", None)):
            raise ValueError(f"environment: {spec}() made a {kind.__name__} without a `reset` method; an "
                             "environment defines reset(**row) (returning None, or text shown after the prompt)")
        methods = public_methods(kind)
        clash = sorted(set(methods) & tool_names)
        if clash:
            raise ValueError(f"environment: {spec}'s methods {clash} are named like tools in `tools`; rename one")
        if not methods:
            raise ValueError(f"environment: {spec}() has no public methods, so the model has no tool to call")
        placeholder = object()  # the schema of a method as bound to an instance (no `self`), without making one
        return cls(spec, factory, tuple(tool_schema(types.MethodType(getattr(kind, name), placeholder))
                                        for name in methods), callable(getattr(kind, "get_reward", None)))
