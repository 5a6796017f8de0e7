"""The training loop and what it is assembled from.

- `trainer.py`: `Distiller`, the loop: assemble the run's parts, then per step take the rollout, score, backward,
  step, log, checkpoint.
- `assembly.py`: the run's parts built from the config (student, data, rollout producer, objective, hooks);
  `teacher_assembly.py`: the teachers, one path shared with `distill eval` and `distill cache-teacher`;
  `student_access.py`: the student as it is now, for the rollout and the weight sync.
- `rollout.py`: the rollout producer (request the rollout of step k; take it) and a step's micro-batches.
- `metrics.py`: token-weighted metric windows, reduced over processes once.
- `runtime.py`: accelerate, the device and precision; `sharding.py`: FSDP for the student; `cpu_memory.py`:
  glibc's mmap threshold for a training process on CPU.

Importing this package imports none of them (the trainer pulls in accelerate and transformers).
"""
