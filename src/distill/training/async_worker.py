"""What the asynchronous producer's worker works from and hands back (`distill.training.async_rollout`): its frozen
copy of the student, snapshots of the trainable weights per version, and its result for a step."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from distill.generation.sample import Sample
from distill.training.student_sampler import Metrics

Snapshot = dict[str, torch.Tensor]  # parameter name -> its value, on the CPU
Samples = dict[int, list[Sample]]  # micro-batch index -> the student's samples of its rows


@dataclass(frozen=True)
class Sampled:
    """The worker's rollout of a step: the student's samples, the worker's timings and tool-call loop metrics, and the
    weights version that sampled it."""

    samples: Samples
    timings: dict[str, float]
    loop_metrics: Metrics
    version: int


@dataclass(frozen=True)
class Failed:
    """The worker failed a step's rollout with `error` (handed to the training thread, which fails the step): any
    exception, those outside `Exception` too (`SystemExit` from an environment, `asyncio.CancelledError` out of an
    async reward), which would otherwise end the thread without a word."""

    error: BaseException


def describe(error: BaseException) -> str:
    """`error` in one line: its type and message (its type alone when it has none: a bare `CancelledError`)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def frozen_copy(student: nn.Module) -> nn.Module:
    """A copy of the student for sampling only: no gradients, eval mode."""
    duplicate = copy.deepcopy(student)
    duplicate.eval()
    duplicate.requires_grad_(False)
    return duplicate


def trainable_snapshot(student: nn.Module) -> Snapshot:
    """`student`'s trainable weights as they are now, copied to the CPU."""
    return {name: p.detach().to("cpu", copy=True) for name, p in student.named_parameters() if p.requires_grad}


def load_snapshot(model: nn.Module, snapshot: Snapshot) -> None:
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in snapshot.items():
            parameters[name].copy_(value)
