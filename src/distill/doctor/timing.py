"""How long a run will take, extrapolated from a few of its steps run and timed the way training runs them.

A step's time is the sum of its phases: generation (the student's samples, the teacher's samples), scoring by the
teacher, the student's forward and backward passes, the optimizer step. Generation depends on the step's sources,
which a schedule changes (GKD's default samples the teacher for 54 steps, then mixes in the student), so one
measured step does not stand for every step. The unit costs are measured per micro-batch of each source, on the
first two steps and on the first step that generates each source those do not, then summed over the sources every
step of the run draws (drawing them generates nothing: `StepTimer.generated_sources`).
"""

from __future__ import annotations

from dataclasses import dataclass

GENERATED = ("student", "teacher")  # the sources that are sampled; "dataset" completions cost nothing to make
PHASES = ("generation_student", "generation_teacher", "stage", "teacher", "student", "optimizer")  # seconds


def step_seconds(timings: dict[str, float]) -> float:
    """A timed step's seconds (its timings also count tokens and micro-batches)."""
    return sum(timings.get(phase, 0.0) for phase in PHASES)


def steps_to_time(generated_sources: list[list[str]]) -> list[int]:
    """Step 0, step 1 (the passes and the optimizer again, warm: the first of each allocates what it keeps), and the
    first step that generates each sampled source steps 0 and 1 do not."""
    steps = list(range(min(2, len(generated_sources))))
    covered = {source for step in steps for source in generated_sources[step]}
    for step, sources in enumerate(generated_sources):
        missing = (set(sources) & set(GENERATED)) - covered
        if missing:
            steps.append(step)
            covered |= missing
    return steps


@dataclass
class UnitCosts:
    """Seconds per generated micro-batch of each sampled source, per trained micro-batch (the teacher's scoring and the
    student's passes), and per optimizer step."""

    generation: dict[str, float]
    trained_micro_batch: float
    optimizer_step: float


def unit_costs(timed: list[dict[str, float]], micro_batches_per_step: int) -> UnitCosts:
    """The unit costs of timed steps (`StepTimer.time_step`'s timings, one dict a step)."""

    def total(key: str) -> float:
        return sum(t.get(key, 0.0) for t in timed)

    generation = {source: total(f"generation_{source}") / total(f"generated_micro_batches/{source}")
                  for source in GENERATED if total(f"generated_micro_batches/{source}")}
    # The fastest timed step's: the first step's passes and optimizer step include their one-off allocations.
    passes = min(t.get("stage", 0.0) + t.get("teacher", 0.0) + t.get("student", 0.0) for t in timed)
    return UnitCosts(generation, passes / micro_batches_per_step, min(t.get("optimizer", 0.0) for t in timed))


def estimate(costs: UnitCosts, generated_sources: list[list[str]], micro_batches_per_step: int) -> dict[str, float]:
    """Seconds the run's steps take, by phase: "generation/<source>", "passes" (teacher and student), "optimizer",
    and "total"."""
    phases = {f"generation/{source}": cost * sum(sources.count(source) for sources in generated_sources)
              for source, cost in costs.generation.items()}
    steps = len(generated_sources)
    phases["passes"] = costs.trained_micro_batch * micro_batches_per_step * steps
    phases["optimizer"] = costs.optimizer_step * steps
    phases["total"] = sum(phases.values())
    return phases
