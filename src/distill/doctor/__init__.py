"""`distill doctor` and the checks every `distill train` runs at start: what users trip over before it costs a run.

- `findings.py`: a `Finding` (severity, what was measured, the fix) and the registry of checks (`register_check` into
  `CHECKS`, a `distill.registry.Registry`), each with the failure it comes from (an upstream issue or a measurement
  here). The built-in checks register when the table is first used (by the import path of `checks.py`).
- `context.py`: what a check reads: the resolved config, the method, the rows, both tokenizers and models.
- `checks.py`: the checks, in the order they are reported; `memory.py`: the memory estimate the `memory` check reads.
- `setup_problems.py`: the set-up's problems, raised at the first by `distill train`, kept by `distill doctor` where
  nothing later builds on them, so it lists every finding it can reach.
- `run.py`: every registered check run on a context; a check that raises is a warning (an error when the run itself
  would stop there), never a crash; a check that runs the run's steps is not run after an error.
- `report.py`: findings as text, the run's `checks.json`, and the decision to stop (errors, or warnings with
  `strict_checks`).
"""
