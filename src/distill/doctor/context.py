"""What the checks read: the run as `distill train` has it just before anything is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from torch import nn

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.data import EncodedExample, Example
    from distill.losses import LogitHead
    from distill.methods.base import Method


class StepTimer(Protocol):
    """The run's steps as the doctor measures them (`distill.training.step.StepTimer`): built from the run's assembly,
    never a method of the trainer."""

    def generated_sources(self) -> list[list[str]]:
        """Per optimizer step, the sources of the micro-batches it generates ([] for a step that reuses an earlier
        step's rollout), drawn without generating anything."""
        ...

    def time_step(self, step: int) -> dict[str, float]:
        """Step `step` run as training runs it, timed by phase, without moving the weights (and, unless told to run
        them, without calling the run's tools or environment: `tool_stand_in`)."""
        ...

    def tool_stand_in(self) -> str | None:
        """The text that answered the timed steps' tool calls in place of the tools; None when they ran (or there are
        none)."""
        ...


@dataclass
class DoctorContext:
    """config: resolved (the method's defaults filled in); examples: the training rows; student: as it trains (layers
    dropped); student_given: the student is a model of its own (not the teacher's weights); teacher: the teacher model
    held here, or None (a server, a cache, the student itself); eos_ids: the run's end-of-turn ids; encoded: the rows in
    the student's ids; doctor: `distill doctor` (it also runs the checks that take a while); steps: the run's steps,
    drawn and timed as training runs them without moving the weights (`StepTimer`; only when a check asks)."""

    config: DistillConfig
    method: Method
    examples: list[Example]
    student: nn.Module
    tokenizer: Any
    teacher: nn.Module | None
    teacher_tokenizer: Any
    student_given: bool
    eos_ids: list[int]
    encoded: list[EncodedExample] | None = None  # the training rows in the student's ids, when encoded
    doctor: bool = False  # `distill doctor`, which also runs the checks that take a while (a measured step)
    teacher_head: LogitHead | None = None  # a hidden-state teacher's head held here, or None
    steps: StepTimer | None = None

    @property
    def same_tokenizer(self) -> bool:
        return self.teacher_tokenizer is None or not self.method.cross_tokenizer
