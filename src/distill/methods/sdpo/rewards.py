"""Reward functions for the RL methods (sdpo, and grpo as its special case): built-ins and user functions.

A reward function is called once per batch of completions:

    function(prompts, completions, rows) -> list of floats, one per completion

    prompts      the rows' prompts: text, or chat messages (lists of {"role", "content"})
    completions  the completion texts, decoded without special tokens
    rows         the dataset rows, dicts of every column (`answer`, `feedback`, your own ones)

Built-ins, by name (each gives 0 or 1):

    contains_answer  the completion holds the row's `answer` as whole words, after normalisation
                     (`distill.tasks.answers`: "12" is not found in "123", "Paris" is in "It is Paris.")
    equals_answer    the normalised completion is the normalised answer
    regex            the completion matches `reward_regex` (re.search)

A user function is named by import path, 'package.module:function'. It may declare the values it can
return with an attribute `reward_range = (low, high)`; then `success_reward_threshold` is checked against
the weighted range when the run is built (with any function without one the range is unknown and
unchecked). Several functions combine as a weighted sum, reward = sum_k weight_k r_k.

A function that raises, returns another number of values than completions, or a value that is not a
finite number stops the run with a `RewardFunctionError` naming the function and the dataset row (the
trainer checkpoints the step before first).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Callable

import torch

from distill.callables import import_callable
from distill.errors import RewardFunctionError
from distill.tasks.answers import contains_answer, normalise

ANSWER_REWARDS = ("contains_answer", "equals_answer")
BUILTINS = (*ANSWER_REWARDS, "regex")


@dataclass(frozen=True)
class RewardFunction:
    """One reward function: its name (a built-in's, or the import path), the callable, and the range of
    its values when known."""

    name: str
    function: Callable[[list, list[str], list[dict]], list]
    value_range: tuple[float, float] | None


def _contains(prompts, completions, rows) -> list[float]:
    return [float(contains_answer(text, str(row["answer"]))) for text, row in zip(completions, rows)]


def _equals(prompts, completions, rows) -> list[float]:
    return [float(bool(normalise(str(row["answer"]))) and normalise(text) == normalise(str(row["answer"])))
            for text, row in zip(completions, rows)]


def _regex(pattern: re.Pattern) -> Callable:
    def matches(prompts, completions, rows) -> list[float]:
        return [float(pattern.search(text) is not None) for text in completions]

    return matches


def load_reward_function(spec: str, regex: str | None = None) -> RewardFunction:
    """The reward function `spec` names (a built-in, or 'package.module:function'); ValueError naming
    `reward_funcs` when it does not resolve."""
    if spec == "contains_answer":
        return RewardFunction(spec, _contains, (0.0, 1.0))
    if spec == "equals_answer":
        return RewardFunction(spec, _equals, (0.0, 1.0))
    if spec == "regex":
        if not regex:
            raise ValueError("reward_funcs has 'regex' but reward_regex is empty: give the pattern a rewarded completion matches")
        try:
            return RewardFunction(spec, _regex(re.compile(regex)), (0.0, 1.0))
        except re.error as error:
            raise ValueError(f"reward_regex {regex!r} is not a valid regular expression: {error}") from None
    if ":" not in spec:
        raise ValueError(f"reward_funcs: {spec!r} is neither a built-in ({', '.join(BUILTINS)}) nor an import path "
                         "'package.module:function'")
    function = import_callable(spec, "reward_funcs")
    declared = getattr(function, "reward_range", None)
    value_range = None
    if declared is not None:
        try:
            low, high = (float(v) for v in declared)
        except (TypeError, ValueError):
            raise ValueError(f"reward_funcs: {spec}.reward_range must be (low, high), got {declared!r}") from None
        if not low <= high:
            raise ValueError(f"reward_funcs: {spec}.reward_range must have low <= high, got {declared!r}")
        value_range = (low, high)
    return RewardFunction(spec, function, value_range)


def weighted_range(functions: list[RewardFunction], weights: list[float]) -> tuple[float, float] | None:
    """The range of sum_k w_k r_k, or None when some function's range is unknown."""
    ranges = [f.value_range for f in functions]
    if any(r is None for r in ranges):
        return None
    known = [r for r in ranges if r is not None]
    low = sum(min(w * r[0], w * r[1]) for r, w in zip(known, weights))
    high = sum(max(w * r[0], w * r[1]) for r, w in zip(known, weights))
    return low, high


class Rewards:
    """The configured reward functions and their weights, applied to a batch of completions; with `environment`, the
    environment's own reward (its `get_reward`, read from each conversation) is one more column, with weight 1."""

    def __init__(self, functions: list[RewardFunction], weights: list[float], environment: bool = False):
        if len(functions) != len(weights):
            raise ValueError(f"reward_weights has {len(weights)} values for {len(functions)} reward functions")
        self.functions, self.environment = functions, environment
        self.weights = [float(w) for w in weights] + ([1.0] if environment else [])

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.functions] + (["environment"] if self.environment else [])

    def __call__(self, prompts: list, completions: list[str], rows: list[dict], row_ids: list[int],
                 environment_rewards: list[float | None] | None = None) -> torch.Tensor:
        """(n, K) float64: each function's value for each completion; `row_ids` are the dataset rows (for errors);
        `environment_rewards`: each completion's environment reward (read when the environment owns one)."""
        columns = [self._values(f, prompts, completions, rows, row_ids) for f in self.functions]
        if self.environment:
            given = environment_rewards or [None] * len(completions)
            missing = [row_id for value, row_id in zip(given, row_ids) if value is None]
            if missing:
                raise RewardFunctionError(f"the environment owns a reward but dataset rows {missing[:8]} have none: only a "
                                          "conversation the environment took part in has one")
            columns.append([float(v) for v in given if v is not None])
        return torch.tensor(columns, dtype=torch.float64).T.reshape(len(completions), len(self.names))

    def total(self, values: torch.Tensor) -> torch.Tensor:
        """(n,) the weighted sum of (n, K) per-function values."""
        return values @ torch.tensor(self.weights, dtype=torch.float64)

    @staticmethod
    def _values(f: RewardFunction, prompts, completions, rows, row_ids) -> list[float]:
        try:
            values = f.function(prompts, completions, rows)
        except Exception as error:
            raise RewardFunctionError(_failing_row(f, prompts, completions, rows, row_ids, error)) from error
        try:
            values = list(values)
        except Exception as error:  # not iterable, or a generator that raises
            raise RewardFunctionError(f"reward function {f.name} returned {type(values).__name__}, not a list of "
                                      f"{len(completions)} numbers ({type(error).__name__}: {error})") from error
        if len(values) != len(completions):
            raise RewardFunctionError(f"reward function {f.name} returned {len(values)} values for {len(completions)} "
                                      f"completions (dataset rows {row_ids[:8]}...); it must return one per completion")
        checked = []
        for value, row_id in zip(values, row_ids):
            try:
                number = float(value) if isinstance(value, numbers.Real) else None  # bools and numpy numbers too
            except (OverflowError, ValueError):  # an int too large for a float
                number = None
            if number is None or not math.isfinite(number):
                raise RewardFunctionError(f"reward function {f.name} returned {value!r} for dataset row {row_id}; every "
                                          "value must be a finite number")
            checked.append(number)
        return checked


def _failing_row(f: RewardFunction, prompts, completions, rows, row_ids, error: Exception) -> str:
    """The message for a reward function that raised on a batch: the first row it raises on alone."""
    for i, row_id in enumerate(row_ids):
        try:
            f.function(prompts[i : i + 1], completions[i : i + 1], rows[i : i + 1])
        except Exception as row_error:
            return (f"reward function {f.name} raised on dataset row {row_id} (completion {completions[i][:80]!r}): "
                    f"{type(row_error).__name__}: {row_error}")
    return f"reward function {f.name} raised on a batch of dataset rows {row_ids[:8]}...: {type(error).__name__}: {error}"
