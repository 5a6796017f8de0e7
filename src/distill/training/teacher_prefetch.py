"""Scoring a whole step before any loss, for a teacher outside the process (a server, a cache).

All the step's requests go out in one concurrent round (`Teacher.score_many`), and every
process learns whether any failed before anyone enters a collective of the step: a dead server then ends
every process with the error instead of leaving the others waiting in an all-reduce.
"""

from __future__ import annotations

from distill.errors import TeacherServerError
from distill.training.runtime import phase_clock


def score_step_ahead(teacher, micro_batches: list, temperature: float, runtime, timings: dict[str, float]) -> list:
    """One signal per micro-batch; the seconds spent go to timings["teacher"]. A `TeacherServerError` on any
    process raises one on every process (the trainer checkpoints and stops); any other failure is a bug or
    bad data, raised everywhere without a checkpoint (there is nothing to resume)."""
    start, signals, error = phase_clock(runtime.device), None, None
    try:
        signals = teacher.score_many(micro_batches, temperature)
    except Exception as failure:  # any failure: the other processes must learn of it, not wait for this one
        error = failure
    timings["teacher"] = timings.get("teacher", 0.0) + phase_clock(runtime.device) - start
    failed, not_server = runtime.agree([error is not None, error is not None and not isinstance(error, TeacherServerError)])
    if not_server:
        raise error or RuntimeError("the teacher of another process failed (its error is in that process's log)")
    if failed:
        raise error or TeacherServerError("the teacher server of another process failed (its error is in that process's log)")
    assert signals is not None  # no process failed
    return signals
