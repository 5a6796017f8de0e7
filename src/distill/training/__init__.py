"""The training loop and what it is assembled from.

- `trainer.py`: `Distiller`, the loop: assemble the run, check it, set up its training state, then per step train,
  log, checkpoint.
- `recipe.py`: the run assembled top to bottom into one `Assembly` (method, rows, runtime, models, teachers, rollout);
  `assembly.py`: the pieces it is built from (student, data, sampler, optimizer, rollout producer); `image_checks.py`:
  rows with images against the models that read them;
  `teacher_assembly.py`: the teachers, one path shared with `distill eval` and `distill cache-teacher`;
  `student_access.py`: the student as it is now, for the rollout and the weight sync;
  `start_checks.py`: the doctor's start-of-run checks on the assembly.
- `state.py`: the `TrainingState` set-up prepares (the wrapped student, optimizer, schedule, hooks, run directory);
  `step.py`: one step's passes (rollout, teacher signals, forward and backward) and the doctor's `StepTimer`.
- `plan.py`: completion sources, the method's `SourcePlan` and `StepStage`, `RolloutSettings`, the `RolloutProducer`
  interface (request the rollout of step k; take it). `rollout.py`: the synchronous producer; `async_rollout.py` (and
  `async_worker.py`): the asynchronous one (`max_staleness`). Both are composed of `rollout_parts.py`: the student
  sampler (`student_sampler.py`), the teacher's seq_kd window (`teacher_window.py`), the dataset's completions and the
  micro-batches made of the samples (`completions.py`), the method's stage (`stage.py`).
- `metrics.py`: token-weighted metric windows, reduced over processes once.
- `runtime.py`: accelerate, the device and precision; `teacher_prefetch.py`: a remote teacher's step scored up front
  on its clock; `cpu_memory.py`:
  glibc's mmap threshold for a training process on CPU.

Importing this package imports none of them (the trainer pulls in accelerate and transformers).
"""
