"""The run directory: what a run writes and how it resumes.

- `directory.RunDirectory`: config.yaml, metrics.jsonl, checkpoints, the final model, the evaluation report;
  resume; the output-directory checks (`check_output_dir`, `resume_config`).
- `metrics_log`: metrics.jsonl, appended each logging step and read back.
- `lock`: run.lock, one run per directory (stale locks taken over).
- `checkpoint`: saving and loading the student, optimizer, schedule, RNG and step hooks.
- `model_card`: README.md beside the final student.
- `plot`: the PNG curves of metrics.jsonl (`distill plot`).
"""
