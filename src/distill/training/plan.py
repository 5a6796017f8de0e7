"""Completion sources and the rollout producer's interface: what methods and the trainer see of the rollout.

Every micro-batch of an optimizer step gets one source, drawn before anything is generated:
    "student": the student samples (on-policy)          probability lmbda
    "dataset": the dataset's own completion              otherwise, without seq_kd
    "teacher": the teacher samples (sequence-level KD)   otherwise, with seq_kd
The draw depends only on (seed, step, micro-batch), so every process makes the same choice without
communicating, and a resumed run makes the same choices as an uninterrupted one.

How each micro-batch draws its source is the method's choice: a `SourcePlan` (GKD's lmbda mix in
`distill.methods.mixing`). Generation is batched per source over the whole step (all of this process's
micro-batches at once): the student generates once, the teacher once, and only for the micro-batches that
use their output (`distill.training.rollout.StepRollout`).

The rollout producer. The trainer asks for the rollout of step k (`RolloutProducer.request`) and takes it when
step k trains (`take`); between the two a producer may generate ahead (`distill.training.async_rollout.AsyncRollout`,
with `max_staleness`: a worker thread, within the bound) or not at all (`StepRollout`, synchronous: it generates in
`take`). Every student-sampled completion records the weights version that sampled it (`Completion.weights_version`:
the optimizer steps applied to the student when it sampled), and a micro-batch's staleness is the trained version
minus the oldest of its rows' (`MicroBatch.staleness`). Objectives read that integer: 0 means the sampling policy is
the one being trained. Rollout reuse (`num_iterations`) is a producer's reuse window: steps k .. k + num_iterations - 1
take the rollout sampled at step k, at staleness 0 .. num_iterations - 1. What a producer holds between steps (a
reused rollout) it checkpoints itself, as a step hook (`state_dict`).

Rollout log-probs. A method that asks for them (`Method.records_log_probs`) gets, for every sampled
token, its log-prob under the distribution it was actually drawn from: the student's logits divided by
`sampling_temperature`, then top-k and top-p filtering, renormalised (transformers' processed scores; the
sampled token is never one that filtering removed, so the value is finite). With top_k 0 and top_p 1 that
is log softmax(logits / sampling_temperature). Dataset and teacher completions have none (None).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ContextManager, Protocol

from distill.data import Example, StepSampler
from distill.generation.engine import SamplingParams

if TYPE_CHECKING:
    from distill.agents.guidance import DepthCurriculum, GuidedTurns
    from distill.agents.loop import ToolLoop
    from distill.batch import MicroBatch

SOURCES = ("student", "dataset", "teacher")
# An asynchronous producer's timers (logged as time/NAME, seconds per step): copying the weights of a new version and
# loading (pushing) them where the student samples, the training thread waiting for a rollout, the worker sampling it,
# the training thread from taking a rollout to its optimizer step.
ASYNC_TIMERS = ("weight_push", "queue_wait", "generation", "training")
# How an asynchronous producer keeps within max_staleness (`staleness_pacing`, `distill.training.async_rollout`).
PACINGS = ("wait", "drop")


class SourcePlan(Protocol):
    """Which completion source each micro-batch of a step uses (a method's choice)."""

    def draw(self, seed: int, step: int, num_micro_batches: int) -> list[str]:
        """The sources of step `step`'s micro-batches; identical on every process."""

    def logged(self, step: int) -> dict[str, float]:
        """What the plan logs for `step` (GKD's mix: its lmbda, the probability of an on-policy micro-batch)."""

    def possible(self) -> frozenset[str]:
        """Every source some step can draw."""


@dataclass
class RolloutSettings:
    """What the step rollout needs from the config."""

    student_sampling: SamplingParams
    teacher_sampling: SamplingParams
    seq_kd_generation_steps: int
    max_steps: int
    seed: int
    record_log_probs: bool
    num_iterations: int = 1
    loss_skip: int = 0  # num_loss_tokens_to_skip
    trains_row: Callable[[Example], bool] | None = None  # the method's; None: every row trains
    tool_loop: ToolLoop | None = None  # `tools`: the student's rollouts are conversations (`distill.agents.loop`)
    guided_turns: GuidedTurns | None = None  # the teacher writes some of their turns (Guided-OPD)
    depth_curriculum: DepthCurriculum | None = None  # their turns grow with training (TCOD)


class StepStage(Protocol):
    """A method's work on a whole step's rollout before any loss (sdpo: rewards, advantages, demonstrations).

    Called once per rollout (a reused rollout is staged once; a restored one again, so the stage must be
    a function of the completions) with the step and this process's micro-batches, on every process at
    once (it may use collectives). It writes what the loss reads as declared annotations (`distill.batch.Annotation`:
    sdpo's `ADVANTAGE`, the self-teacher's `TEACHER_PROMPT` and `DISTILLED`) or micro-batch fields (`advantages`) and
    returns metrics: name -> (numerator, denominator), reduced across processes like every metric."""

    def metric_names(self) -> list[str]: ...

    def __call__(self, step: int, micro_batches: list[MicroBatch]) -> dict[str, tuple[float, float]]: ...


class RolloutSchedule:
    """Which rollout each step trains on, with which sources and prompts: a function of the step alone, the same on
    every process and in a resumed run. `sampler`: the run's prompts per micro-batch; `plan`: the sources."""

    def __init__(self, plan: SourcePlan, sampler: StepSampler, seed: int, num_iterations: int):
        self.plan, self.sampler, self.seed, self.num_iterations = plan, sampler, seed, num_iterations

    def sources(self, step: int) -> list[str]:
        """The completion source of each micro-batch of step `step`."""
        return self.plan.draw(self.seed, self.generation_step(step), self.sampler.accumulation)

    def generation_step(self, step: int) -> int:
        """The step whose rollout `step` trains on (itself unless rollouts are reused)."""
        return step - step % self.num_iterations

    def generations(self, steps: int) -> int:
        """Rollouts generated in the first `steps` optimizer steps (each takes a fresh batch of prompts)."""
        return -(-steps // self.num_iterations)

    def prompt_groups(self, step: int) -> list[list[int]]:
        """The prompts of each micro-batch of `step`'s rollout: the sampler's batch of the rollout's index, so
        that reuse skips no prompt of an epoch."""
        return self.sampler.micro_batch_indices(self.generation_step(step) // self.num_iterations)


class RolloutProducer(ABC):
    """The seam between generating a step's rollout and training on it (module docstring).

    The trainer calls `request(k)` and then `take(k)` for every step k in order, on every process at once.
    A producer is a step hook (`distill.methods.base.StepHook`): its `state_dict` holds what it must
    carry over a resume (plain values), `holds_state` says whether it holds anything at all.
    """

    name = "rollout"

    @abstractmethod
    def request(self, step: int) -> None:
        """Step `step` will train next: a producer may start its rollout (or those after it) now."""

    @abstractmethod
    def take(self, step: int, timings: dict[str, float]) -> list[MicroBatch]:
        """This process's micro-batches of step `step`, each completion with the weights version that sampled it."""

    @abstractmethod
    def sources(self, step: int) -> list[str]:
        """The completion source of each micro-batch of step `step`."""

    @abstractmethod
    def generations(self, steps: int) -> int:
        """Rollouts generated in the first `steps` optimizer steps (each takes a fresh batch of prompts)."""

    @abstractmethod
    def generation_step(self, step: int) -> int:
        """The step whose rollout `step` trains on."""

    def take_stage_metrics(self) -> dict[str, tuple[float, float]]:
        """The method's step-stage metrics (and the tool-call loop's) of the rollout made since the last call."""
        return {}

    def take_producer_metrics(self) -> dict[str, tuple[float, float]]:
        """An asynchronous producer's timers ("time/NAME") and drops ("staleness/dropped") since the last call: name ->
        (sum, steps counted)."""
        return {}

    def metric_names(self) -> tuple[str, ...]:
        """The names `take_stage_metrics` may give (every process registers them)."""
        return ()

    def holds_state(self) -> bool:
        """Whether the producer holds something between steps that a checkpoint must keep."""
        return False

    def start(self, step: int) -> None:
        """Training starts (or resumes) at `step`, with the student's weights of that version."""

    def close(self) -> None:
        """Training ended (or failed): stop whatever runs beside it."""

    def tools_stood_in(self) -> ContextManager[None]:
        """While inside, no tool or environment of the rollouts' conversations runs: a stand-in answers every call
        (`distill doctor`'s timed step)."""
        return contextlib.nullcontext()

    def restore_point(self) -> dict:
        """What `load_state_dict` needs to undo a step that failed (the trainer takes it before each step)."""
        return self.state_dict()

    def after_optimizer_step(self, step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
