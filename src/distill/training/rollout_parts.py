"""What a rollout producer is composed of, built once (`RolloutParts`): the schedule, the student sampler, the assembler
of micro-batches (with the teacher's window) and the method's stage; and what the producers made of them share
(`ComposedRollout`)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ContextManager

import torch

from distill.agents.loop import LOOP_METRICS
from distill.batch import MicroBatch
from distill.data import EncodedExample, Example, StepSampler
from distill.training.completions import RolloutAssembler
from distill.training.plan import RolloutProducer, RolloutSchedule, RolloutSettings, SourcePlan, StepStage
from distill.training.stage import StageRunner
from distill.training.student_sampler import Metrics, ProcessRowSeeds, StepRowSeeds, StudentSampler, WithModel
from distill.training.teacher_window import TeacherWindow


@dataclass
class RolloutParts:
    """`with_student(run)`: `run(student)` with the student as it is now (gathered first under FSDP; every process
    generates at the same steps, since the source plan is the same on all of them)."""

    settings: RolloutSettings
    schedule: RolloutSchedule
    student: StudentSampler
    assembler: RolloutAssembler
    stage: StageRunner
    with_student: WithModel
    device: torch.device

    @classmethod
    def build(cls, plan: SourcePlan, sampler: StepSampler, examples: list[Example], encoded: list[EncodedExample],
              settings: RolloutSettings, with_student: WithModel, teacher, eos_ids: list[int], pad_id: int,
              vocab_size: int, device: torch.device, process_index: int, stage: StepStage | None,
              first_row: int | None = None) -> RolloutParts:
        """The parts of a producer; `first_row`: this process's first row among the step's rows over all processes,
        for a producer whose student samples each row from a seed keyed by it (the asynchronous one), else None (seeds
        keyed by process and row, sampled on the process RNG)."""
        schedule = RolloutSchedule(plan, sampler, settings.seed, settings.num_iterations)
        seeds = (ProcessRowSeeds(settings.seed, process_index) if first_row is None
                 else StepRowSeeds(schedule, settings.seed, first_row))
        student = StudentSampler(schedule, examples, encoded, settings, eos_ids, pad_id, vocab_size, device, seeds,
                                 seeded_rows=first_row is not None, teacher=teacher)
        window = TeacherWindow(schedule, examples, encoded, settings, teacher, eos_ids, device, process_index)
        assembler = RolloutAssembler(schedule, examples, encoded, settings, window, eos_ids, pad_id)
        return cls(settings, schedule, student, assembler, StageRunner(stage, device), with_student, device)


class ComposedRollout(RolloutProducer):
    """What every producer made of `RolloutParts` answers alike: the schedule's sources and steps, the stage's metrics
    with the tool-call loop's, and a rollout sampled here, on the training thread (`sample_here`)."""

    def __init__(self, parts: RolloutParts):
        self.parts, self.settings, self.schedule = parts, parts.settings, parts.schedule
        self.loop_metrics: Metrics = {}  # the tool-call loop's, of the rollouts made since the trainer took them

    def sources(self, step: int) -> list[str]:
        return self.schedule.sources(step)

    def generation_step(self, step: int) -> int:
        return self.schedule.generation_step(step)

    def generations(self, steps: int) -> int:
        return self.schedule.generations(steps)

    def take_stage_metrics(self) -> Metrics:
        metrics = {**self.parts.stage.take_metrics(), **self.loop_metrics}
        self.loop_metrics = {}
        return metrics

    def metric_names(self) -> tuple[str, ...]:
        curricula = (("tools/guidance_probability",) if self.settings.guided_turns is not None else ()) + \
                    (("tools/max_turns",) if self.settings.depth_curriculum is not None else ())
        return self.parts.stage.metric_names() + (LOOP_METRICS + curricula if self.settings.tool_loop is not None else ())

    def close(self) -> None:
        """Training ended (or failed): the tool-call loop's workers end."""
        if self.settings.tool_loop is not None:
            self.settings.tool_loop.close()

    def tools_stood_in(self) -> ContextManager[None]:
        loop = self.settings.tool_loop
        return loop.standing_in() if loop is not None else contextlib.nullcontext()

    def sample_here(self, first: int, timings: dict[str, float]) -> list[MicroBatch]:
        """The rollout of step `first`, sampled now by the student as it is (weights version `first`), not staged yet."""
        parts = self.parts
        samples = parts.student.sample(first, parts.with_student, timings, self.loop_metrics)
        micro_batches = parts.assembler.assemble(first, samples, first, timings, self.loop_metrics)
        parts.stage.new_rollout()
        return micro_batches
