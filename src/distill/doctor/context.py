"""What the checks read: the run as `distill train` has it just before anything is written."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from torch import nn

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.data import EncodedExample, Example
    from distill.methods.registry import Method


@dataclass
class DoctorContext:
    """config: resolved (the method's defaults filled in); examples: the training rows; student: as it trains (layers
    dropped); student_given: the student is a model of its own (not the teacher's weights); teacher: the teacher model
    held here, or None (a server, a cache, the student itself); eos_ids: the run's end-of-turn ids; encoded: the rows in
    the student's ids; doctor: `distill doctor` (it also runs the checks that take a while); time_step: runs one
    optimizer step's phases as training does, timed (`Distiller.time_step`), without moving the weights;
    generated_sources: per step, the sources of the micro-batches it generates (`Distiller.generated_sources`; drawn
    only when a check asks)."""

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
    teacher_head: Any = None  # a hidden-state teacher's head held here (`LogitHead`), or None
    time_step: Callable[[int], dict[str, float]] | None = None
    generated_sources: Callable[[], list[list[str]]] | None = None

    @property
    def same_tokenizer(self) -> bool:
        return self.teacher_tokenizer is None or not self.method.cross_tokenizer
