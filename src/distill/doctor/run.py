"""Running the checks: every registered check in order (the built-in ones, `distill.doctor.checks`, registered when
the table is first used)."""

from __future__ import annotations

from collections.abc import Sequence

from distill.doctor.context import DoctorContext
from distill.doctor.findings import Finding, registered_checks
from distill.errors import StepFailure

__all__ = ["registered_checks", "run_checks"]


def run_checks(context: DoctorContext, earlier: Sequence[Finding] = ()) -> list[Finding]:
    """Every registered check's findings, in order (`earlier`: the set-up's, `distill.doctor.setup_problems`).

    A check that raises is reported, never a crash of the run's start: as an error when what failed is the run's own
    (a `StepFailure`: a teacher server, a reward function; the run itself would stop there), else as a warning (a bug
    of the check, or an input it did not foresee). A check that runs the run's steps runs for `distill doctor` only,
    and not while an earlier finding is an error: it is reported as not run, naming them."""
    findings: list[Finding] = []
    for check in registered_checks():
        if check.runs_the_run:
            if not context.doctor:
                continue
            errors = sorted({f.check for f in [*earlier, *findings] if f.severity == "error"})
            if errors:
                findings.append(Finding(check.name, "info", f"not run: it runs the run's steps, and the errors found "
                                        f"({', '.join(errors)}) stop the run before its first step",
                                        "fix them and run `distill doctor` again"))
                continue
        try:
            findings.extend(check.run(context))
        except StepFailure as error:
            findings.append(Finding(check.name, "error", f"the check could not run because the run itself would stop "
                                    f"here: {type(error).__name__}: {error}", "fix what the error names"))
        except Exception as error:  # noqa: BLE001  (reported, with the check's name)
            findings.append(Finding(check.name, "warning", f"the check could not run: {type(error).__name__}: {error}",
                                    "report it; the run itself is not affected by this check"))
    return findings
