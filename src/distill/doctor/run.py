"""Running the checks: the built-in ones registered (`distill.doctor.checks`), then every registered one in order."""

from __future__ import annotations

import distill.doctor.checks  # noqa: F401  (registers the built-in checks)
from distill.doctor.context import DoctorContext
from distill.doctor.findings import REGISTERED, Check, Finding


def registered_checks() -> list[Check]:
    """Every check, in the order they are reported."""
    return list(REGISTERED.values())


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
