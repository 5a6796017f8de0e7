"""No teacher (a method with teacher "none": sft learns from the dataset's completions alone). The
evaluation still compares the student with its initial weights (`StudentOnlyLocation`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.locations.self_teacher import StudentOnlyLocation
from distill.methods.base import Method

if TYPE_CHECKING:
    from distill.config import DistillConfig


class NoTeacher(StudentOnlyLocation):
    name = kind = words = "none"
    why = "it learns from the dataset's completions and has no teacher"
    title = "# Student fine-tuned on its dataset's completions (no teacher)"

    def check_dataset(self, config: DistillConfig, method: Method, possible_sources: frozenset[str], examples: list) -> None:
        missing = [e.index for e in examples if not e.has_completion]
        if missing:
            raise ValueError(f"dataset row {missing[0]} has no completion ({len(missing)} rows lack one): method "
                             f"{method.name} trains on the dataset's completions; add a 'completion' column (or "
                             "assistant turns in 'messages')")
