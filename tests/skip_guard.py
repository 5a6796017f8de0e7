"""A pytest plugin: a test may skip only for a documented reason, and every run prints how many skipped.

A skip hides a test as well as a failure does, and more quietly (a module-level `importorskip` once hid ten
tests that never touched the package it imported). The documented reasons:

- an optional extra of pyproject.toml is missing: the reason reads `needs the optional extra: pip install
  -e .[NAME]` with NAME declared under [project.optional-dependencies] (write it with `needs_extra`);
- `PLATFORM_REASONS`: facts of the machine no install step changes.

Any other skip fails the run (exit status 1), naming the test and its reason. So does a skip for an extra
named in the environment variable DISTILL_REQUIRED_EXTRAS (comma-separated): a job that installed an extra
to run its tests (.ci/run's vLLM job) fails when they skip instead.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
EXTRA_REASON = re.compile(r"needs the optional extra: pip install -e \.\[([\w-]+)\]")
PLATFORM_REASONS = ("mallopt is glibc's",)


def declared_extras() -> set[str]:
    return set(tomllib.loads(PYPROJECT.read_text())["project"].get("optional-dependencies", {}))


def needs_extra(module: str, extra: str):
    """`module`, imported; skips the calling test when it is missing (the reason the guard accepts)."""
    if extra not in declared_extras():
        raise ValueError(f"{extra!r} is not an optional extra of pyproject.toml")
    return pytest.importorskip(module, reason=f"needs the optional extra: pip install -e .[{extra}]")


def required_extras() -> set[str]:
    return {name.strip() for name in os.environ.get("DISTILL_REQUIRED_EXTRAS", "").split(",") if name.strip()}


def documented(reason: str) -> bool:
    found = EXTRA_REASON.search(reason)
    if found is not None:
        return found.group(1) in declared_extras() and found.group(1) not in required_extras()
    return any(allowed in reason for allowed in PLATFORM_REASONS)


def skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


class SkipGuard:
    def __init__(self) -> None:
        self.skipped: list[tuple[str, str]] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.append((report.nodeid, skip_reason(report)))

    @pytest.hookimpl
    def pytest_collectreport(self, report) -> None:
        if report.skipped:  # a whole module skipped at import
            self.skipped.append((report.nodeid, skip_reason(report)))

    def undocumented(self) -> list[tuple[str, str]]:
        return [(test, reason) for test, reason in self.skipped if not documented(reason)]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session, exitstatus) -> None:
        if self.undocumented() and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter) -> None:
        terminalreporter.write_line(f"skip guard: {len(self.skipped)} test(s) skipped, "
                                    f"{len(self.skipped) - len(self.undocumented())} for a documented reason")
        for test, reason in self.undocumented():
            terminalreporter.write_line(f"skip guard: FAILED {test} skipped for an undocumented reason: {reason!r} "
                                        "(skip only for a missing optional extra, with `needs_extra`)", red=True)


def pytest_configure(config) -> None:
    config.pluginmanager.register(SkipGuard(), "distill_skip_guard")
