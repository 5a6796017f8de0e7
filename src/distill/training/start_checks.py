"""The doctor's start-of-run checks on an assembled run (`distill.doctor`): what users trip over, before any file.

Errors (and warnings with strict_checks) stop the run here; `distill doctor` runs the slower checks too (a measured
step, through `StepTimer`: the assembly's steps, never a method of the trainer) and prints the findings itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.doctor.context import DoctorContext
from distill.doctor.fields import DoctorFields
from distill.doctor.report import act_on
from distill.doctor.run import run_checks
from distill.training.step import StepTimer

if TYPE_CHECKING:
    from distill.doctor.findings import Finding
    from distill.training.assembly import LoadedModels
    from distill.training.recipe import Assembly


def start_checks(parts: Assembly, models: LoadedModels, doctor: bool, setup: list[Finding],
                 runs_tools: bool = False) -> list[Finding]:
    """The set-up's findings (`setup`: kept by `distill doctor`, `distill.doctor.setup_problems`) and every check's
    on `parts` (`models`: as loaded, the teacher model held here among them); raises `ChecksFailed` when one stops
    the run. `doctor`: built by `distill doctor`; `runs_tools`: its timed step calls the run's tools and environment
    (otherwise a stand-in answers)."""
    # A hidden-state payload's head, held here when no teacher model is.
    head = parts.teacher.head if models.teacher is None and parts.teacher is not None else None
    findings = setup + run_checks(DoctorContext(parts.config, parts.method, parts.train_examples, parts.student_model,
                                                parts.tokenizer, models.teacher, models.teacher_tokenizer,
                                                parts.student_given, parts.eos_ids, parts.encoded, doctor, head,
                                                StepTimer(parts, runs_tools)), setup)
    act_on(findings, DoctorFields.of(parts.config).strict_checks, show=not doctor and parts.runtime.is_main_process)
    return findings
