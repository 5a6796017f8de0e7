"""The student as it is now, for whoever generates or evaluates with it outside the training forward.

The rollout samples from the student, a weight sync pushes it to an engine's copy, the evaluation scores it.
None of them reaches into the trainer: the trainer makes one `StudentAccess` before anything else and gives it
to them, and tells it once what the student trains inside (`attach`, at set-up). Under FSDP the student's
parameters are sharded; `__call__` then gathers them for the call (`distill.models.sharding.gathered`), on every
process at the same point, so what runs may generate or evaluate without collectives.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from distill.models import sharding


class StudentAccess:
    """`access(run)` is `run(student)` with the student as it is now; `access.current()` the module itself."""

    def __init__(self, student: nn.Module, fsdp: bool, unwrap: Callable[[nn.Module], nn.Module]):
        """`student`: the model before set-up; `unwrap`: accelerate's, from the wrapper to the training module."""
        self._student, self._fsdp, self._unwrap = student, fsdp, unwrap
        self._wrapped: nn.Module | None = None

    def attach(self, wrapped: nn.Module) -> None:
        """The module the student now trains inside (a `StudentObjective`, as accelerate or FSDP wrapped it)."""
        self._wrapped = wrapped

    def current(self) -> nn.Module:
        return self._unwrap(self._wrapped).student if self._wrapped is not None else self._student

    def __call__(self, run: Callable[[nn.Module], Any]) -> Any:
        if self._fsdp and self._wrapped is not None:
            return sharding.gathered(self._wrapped, run)
        return run(self.current())
