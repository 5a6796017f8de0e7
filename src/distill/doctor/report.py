"""Findings shown, kept and acted on: the text `distill doctor` prints, the run's checks.json, and whether to stop."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from distill.doctor.findings import Finding

CHECKS_FILE = "checks.json"


class ChecksFailed(ValueError):
    """The start-of-run checks found errors (or warnings, with strict_checks): the run stops before writing anything."""

    def __init__(self, findings: list[Finding], stopping: list[Finding]):
        self.findings, self.stopping = findings, stopping
        lines = [f"{len(stopping)} start-of-run check(s) stop this run (`distill doctor` shows them all):"]
        lines += [f"- {line}" for line in (one_line(f) for f in stopping)]
        super().__init__("\n".join(lines))


def one_line(finding: Finding) -> str:
    return f"[{finding.severity}] {finding.check}: {finding.measured}" + (f". Fix: {finding.fix}" if finding.fix else "")


def stopping(findings: list[Finding], strict: bool) -> list[Finding]:
    """The findings that stop a run: errors, and warnings too with `strict_checks`."""
    return [f for f in findings if f.severity == "error" or (strict and f.severity == "warning")]


def act_on(findings: list[Finding], strict: bool, show: bool = True) -> None:
    """Raise `ChecksFailed` when a finding stops the run; otherwise print the warnings (on stderr, when `show`)."""
    stop = stopping(findings, strict)
    if stop:
        raise ChecksFailed(findings, stop)
    if show:
        for finding in findings:
            if finding.severity == "warning":
                print(f"distill: check {one_line(finding)}", file=sys.stderr)


def write_findings(run_dir: Path, findings: list[Finding]) -> None:
    """The run's checks.json: every finding of its start (what `distill doctor` would have shown)."""
    (run_dir / CHECKS_FILE).write_text(json.dumps([f.as_dict() for f in findings], indent=2) + "\n")


def text_report(findings: list[Finding], width: int = 100) -> str:
    """The findings as `distill doctor` prints them: severity first, what was measured, the fix."""
    if not findings:
        return "no findings: every check passed"
    lines = []
    for f in sorted(findings, key=lambda f: ("error", "warning", "info").index(f.severity)):
        lines += textwrap.wrap(f"{f.severity.upper():7} {f.check}: {f.measured}", width, subsequent_indent=" " * 8)
        if f.fix:
            lines += textwrap.wrap(f"fix: {f.fix}", width, initial_indent=" " * 8, subsequent_indent=" " * 13)
    counts = {s: sum(f.severity == s for f in findings) for s in ("error", "warning", "info")}
    lines.append(f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} note(s)")
    return "\n".join(lines)
