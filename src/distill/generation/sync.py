"""Keeping an engine's own copy of the student's weights current.

An engine that decodes the model it is given (the built-ins) needs nothing. One that holds its own copy
(vLLM colocated, or a vLLM server the trainer pushes weights to) sets `keeps_weights` and defines `sync_weights(model)`; `WeightSync`
is the step hook that calls it with the student: once when training starts (a resumed run's student is
the checkpoint's by then) and after every optimizer step, so every rollout samples from the weights the
loss was computed with. With `num_iterations` > 1 a rollout serves several steps and only the steps that
begin a reuse window sample; the weights are synced after each step all the same (a rollout may be drawn
on the next step, and a sync is cheap next to a rollout).
"""

from __future__ import annotations

from typing import Callable

from distill.generation.registry import AUTO, get_engine


class WeightSync:
    """Step hook: `engine.sync_weights(student)` after each optimizer step (and once at `start`), on every
    process. `with_student(run)` runs `run(student)` (the trainer's: under FSDP the parameters gathered).
    `teacher_samplers(visit)` calls `visit(model)` for each model a teacher samples from; at `start` each is
    given to `engine.prepare(model)` (vLLM builds its replicas then, on every process; the others do nothing)."""

    name = "engine_weights"

    def __init__(self, engine, with_student: Callable[[Callable], object],
                 teacher_samplers: Callable[[Callable], None] | None = None):
        self.engine, self.with_student, self.teacher_samplers = engine, with_student, teacher_samplers
        self.syncs = 0

    def start(self) -> None:
        self._sync()
        if self.teacher_samplers is not None:
            self.teacher_samplers(self.engine.prepare)

    def after_optimizer_step(self, step: int) -> None:
        self._sync()

    def _sync(self) -> None:
        self.with_student(self.engine.sync_weights)
        self.syncs += 1

    def state_dict(self) -> dict:
        return {}  # nothing to restore: a resumed run syncs the checkpoint's weights at start

    def load_state_dict(self, state: dict) -> None:
        pass


def weight_sync(engine_name: str, with_student: Callable[[Callable], object],
                teacher_samplers: Callable[[Callable], None] | None = None) -> WeightSync | None:
    """The hook for the engine a run names, when that engine keeps its own weights; None otherwise
    (`auto` takes a built-in engine, which decodes the model it is given)."""
    if engine_name == AUTO:
        return None
    engine = get_engine(engine_name)
    return WeightSync(engine, with_student, teacher_samplers) if engine.keeps_weights else None
