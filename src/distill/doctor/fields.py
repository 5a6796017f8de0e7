"""The doctor feature (the checks `distill doctor` runs, also at the start of every run): its setting and what it
reads. A leaf, composed into `DistillConfig` when the feature is declared (`distill.parts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distill.config.io import PartFields, setting
from distill.features import Feature
from distill.registry import Reads


@dataclass
class DoctorFields(PartFields):
    """How the start-of-run checks' findings stop a run."""

    placed_after: ClassVar[str] = "max_turns"

    strict_checks: bool = setting(False, "Stop at start on a check's warning too, not only on its errors (the checks "
                                  "`distill doctor` runs; their findings are in the run's checks.json).")


class Doctor(Feature):
    """The start-of-run checks: every run reads `strict_checks`."""

    name = "doctor"
    fields = (DoctorFields,)

    def reads(self, sources: frozenset[str]) -> tuple[Reads, ...]:
        return (Reads("every run", ("strict_checks",)),)
