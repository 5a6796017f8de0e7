"""The held-out evaluation before and after training (and `distill eval`).

- `evaluator.Evaluator`: the student against the evaluation's teacher on teacher and own completions
  (KLs, top-1 agreement, aligned divergence across tokenizers), answer accuracy, side-by-side examples;
  `build_report` / `write_report` (eval.json, eval.md).
- `distill.tasks.answers` (a leaf, read by rewards too): whether a greedy answer contains the expected one;
  `distill.tasks.bfcl.scoring`: whether a greedy answer's calls are right by BFCL's rules, on rows with a BFCL column.
"""
