"""The method's step stage run on each rollout once (`StageRunner`), for either rollout producer."""

from __future__ import annotations

import torch

from distill.batch import MicroBatch
from distill.training.plan import StepStage
from distill.training.runtime import phase_clock
from distill.training.student_sampler import Metrics, add_time


class StageRunner:
    """Runs `stage` (the method's work on a rollout before any loss, sdpo's rewards; None: no stage) once per rollout and
    keeps its metrics until the trainer takes them."""

    def __init__(self, stage: StepStage | None, device: torch.device):
        self.stage, self.device = stage, device
        self.staged: int | None = None  # the generation step whose rollout the stage has seen
        self.restored = False  # the reused rollout came from a checkpoint (its stage metrics are logged already)
        self.metrics: Metrics = {}  # the last stage's, taken by the trainer

    def metric_names(self) -> tuple[str, ...]:
        return tuple(self.stage.metric_names()) if self.stage is not None else ()

    def new_rollout(self, restored: bool = False) -> None:
        """A rollout the stage has not seen comes next (`restored`: one from a checkpoint, staged before the resume)."""
        self.staged, self.restored = None, restored

    def run(self, first: int, micro_batches: list[MicroBatch], timings: dict[str, float]) -> None:
        """The method's step stage on the rollout of step `first`, once per rollout."""
        if self.stage is not None and self.staged != first:
            start = phase_clock(self.device)
            metrics = self.stage(first, micro_batches)
            # A rollout restored from a checkpoint was staged before the interruption, its metrics added to a
            # window then (logged, or lost with the window's other metrics if the run stopped before the log).
            self.metrics = {} if self.restored else metrics
            self.staged, self.restored = first, False
            add_time(timings, "stage", phase_clock(self.device) - start)

    def take_metrics(self) -> Metrics:
        metrics, self.metrics = self.metrics, {}
        return metrics
