"""Running the checks: every registered check in order (the built-in ones, `distill.doctor.checks`, registered when
the table is first used)."""

from __future__ import annotations

from distill.doctor.context import DoctorContext
from distill.doctor.findings import Finding, registered_checks

__all__ = ["registered_checks", "run_checks"]


def run_checks(context: DoctorContext) -> list[Finding]:
    """Every registered check's findings, in order; a check that raises is reported as a warning (a bug of the check,
    or an input it did not foresee), never a crash of the run's start."""
    findings: list[Finding] = []
    for check in registered_checks():
        try:
            findings.extend(check.run(context))
        except Exception as error:  # noqa: BLE001  (reported, with the check's name)
            findings.append(Finding(check.name, "warning", f"the check could not run: {type(error).__name__}: {error}",
                                    "report it; the run itself is not affected by this check"))
    return findings
