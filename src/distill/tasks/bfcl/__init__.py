"""The Berkeley Function Calling Leaderboard (BFCL) as distill data, score and environment.

BFCL's data ships in the PyPI package `bfcl-eval` (Apache-2.0), installed without its dependencies
(`pip install --no-deps bfcl-eval==2026.3.23`): `bfcl_eval/data/BFCL_v4_*.json`, the accepted answers under
`data/possible_answer/`, and the stateful Python back-ends of its multi-turn categories. distill reads the files and
imports the back-ends; it never imports BFCL's own checker (that needs the package's full dependencies:
`scripts/bfcl_official_check.sh` runs it in an environment of its own).

- `schemas.py`: BFCL's function documents (`"type": "dict"`, `float`, `tuple`, `any`) as JSON-schema tools.
- `rows.py`: BFCL entries and their accepted answers as distill rows (`prompt`, `tools`, `completion`, `bfcl`).
- `split.py`: train and held-out sets that share no function; `python -m distill.tasks.bfcl` writes them.
- `checker.py`: BFCL's AST rules for a call (name, required and optional arguments, types, accepted values).
- `scoring.py`: a generated turn's calls scored against a row, as a reward function and an evaluation metric.
- `backends.py`, `environment.py`: BFCL's multi-turn back-ends as a distill environment (their methods the tools,
  the row's initial configuration its `reset`, the ground truth's end state its reward).
"""
