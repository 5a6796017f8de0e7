"""Findings and the registry of checks.

A check is a function of a `DoctorContext` returning findings (none when all is well). It is registered with a
name, a one-line title (the Troubleshooting page lists them) and the failure it comes from, so a user reading a
finding can see the report that made it a check. Severities:

    error    the run would train on something wrong or fail later: `distill train` stops before writing anything
    warning  likely wrong for this setup; printed, kept in the run's checks.json (`strict_checks` stops on it)
    info     a fact worth knowing that needs no change (pad == EOS, handled)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable

from distill.registry import Registry, resolve

if TYPE_CHECKING:
    from distill.doctor.context import DoctorContext

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """What a check found: its severity, what it measured (numbers, ids, names) and what to do."""

    check: str
    severity: str
    measured: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"a finding's severity is one of {SEVERITIES}, got {self.severity!r}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    source: str  # the failure it comes from: an upstream issue, or a measurement here
    run: Callable[["DoctorContext"], list[Finding]]
    # It runs the run's own steps: `distill doctor` only, and only while no earlier finding is an error (a run that
    # would stop before its first step has no step to run; one that does not fit in memory should not try).
    runs_the_run: bool = False

    @property
    def fields(self) -> tuple[type, ...]:
        """A check has no settings of its own."""
        return ()


# The checks by name, reported in registration order (`distill.doctor.run`). The built-in checks register themselves
# (`register_check`) when their module is imported, which the table does by import path when it is first used.
BUILT_IN_CHECKS = "distill.doctor.checks"
CHECKS: Registry[Check] = Registry("doctor check", "doctor check", load=lambda: resolve(BUILT_IN_CHECKS))


def register_check(name: str, title: str, source: str, runs_the_run: bool = False):
    """Decorator: `function(context) -> list[Finding]` becomes the check `name` (a name may be registered once);
    `runs_the_run`: it runs the run's own steps (`Check.runs_the_run`)."""
    def register(function: Callable[["DoctorContext"], list[Finding]]):
        CHECKS.register(Check(name, title, source, function, runs_the_run))
        return function

    return register


def unregister_check(name: str) -> None:
    """Remove a check (tests that register a toy clean up with this)."""
    CHECKS.unregister(name)


def registered_checks() -> list[Check]:
    """Every check, in the order they are reported."""
    return [CHECKS.get(name) for name in CHECKS.names()]
