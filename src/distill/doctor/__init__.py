"""`distill doctor` and the checks every `distill train` runs at start: what users trip over before it costs a run.

- `findings.py`: a `Finding` (severity, what was measured, the fix) and the registry of checks (`register_check` into
  `CHECKS`, a `distill.registry.Registry`), each with the failure it comes from (an upstream issue or a measurement
  here). The built-in checks register when the table is first used (by the import path of `checks.py`).
- `context.py`: what a check reads: the resolved config, the method, the rows, both tokenizers and models.
- `checks.py`: the checks, in the order they are reported.
- `run.py`: every registered check run on a context; a check that raises is a warning, never a crash.
- `report.py`: findings as text, the run's `checks.json`, and the decision to stop (errors, or warnings with
  `strict_checks`).
"""
