"""The command-line commands beside `distill train` (`distill.cli` parses the arguments and calls them):

- `eval`: `distill eval`, the training run's evaluation for any student or run directory;
- `cache_teacher`: `distill cache-teacher`, a teacher's sparse log-probs written to disk once;
- `serve_teacher`: `distill serve-teacher`, a teacher model behind vLLM's completions API.
"""
