"""Problems found while a run is set up (`distill.training.recipe.assemble`), before the start-of-run checks.

`distill train` stops at the first one, as it always has. `distill doctor` lists every finding it can reach: a
problem of a check that the rest of the set-up does not build on (the output directory taken, a dataset smaller than
one step's prompts, lengths past a model's context, rows without the completions the run needs) is kept as an error
finding and the set-up goes on, so the models still load and the other checks still run; a problem the rest builds
on (a model that does not load, a malformed row) still stops the set-up, and the findings kept so far are reported
with it. The checks that run the run's own step are then not run (`distill.doctor.run`), saying why.
"""

from __future__ import annotations

from typing import Callable

from distill.doctor.findings import Finding
from distill.doctor.report import ChecksFailed
from distill.errors import StepFailure

SETUP = "setup"  # the finding of the problem that stopped the set-up


class SetupProblems:
    """The set-up's problems: raised at once (`collect` False: `distill train`), or kept as error findings
    (`collect` True: `distill doctor`), in the order found."""

    def __init__(self, collect: bool):
        self.collect = collect
        self.findings: list[Finding] = []

    def check(self, name: str, run: Callable[[], None]) -> None:
        """Run `run`, a check of the set-up that nothing later builds on. Its ValueError is raised, or, collecting, kept
        as the error finding `name` (its message names the field or row and the fix)."""
        if not self.collect:
            run()
            return
        try:
            run()
        except ValueError as error:
            self.findings.append(Finding(name, "error", str(error)))

    def stopped(self, error: ValueError | StepFailure) -> ChecksFailed:
        """What `distill doctor` reports when `error` stopped the set-up: the findings kept so far, `error`, and that
        the start-of-run checks did not run (they read the models and rows the set-up did not finish)."""
        findings = [*self.findings, Finding(SETUP, "error", str(error)),
                    Finding("checks", "info", "not run: the set-up stopped at the error above, before the models and "
                            "rows the start-of-run checks read were ready", "fix it and run `distill doctor` again")]
        return ChecksFailed(findings, [f for f in findings if f.severity == "error"])
