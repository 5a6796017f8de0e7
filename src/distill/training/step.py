"""One optimizer step's passes, read from the run's assembly: the rollout, the teacher's signals, the student's
forward and backward passes (gradients accumulated, nothing stepped); and the doctor's view of a step
(`StepTimer`: the same passes timed, the weights left as they were).

The loss of each micro-batch is scaled by num_processes / (trained tokens of the whole step, all micro-batches, all
processes): DDP averages gradients over processes, hence the factor; the gradient does not depend on how the step's
tokens are split into micro-batches or processes (checked by the split-invariance tests).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from distill.conversations.calls import STAND_IN
from distill.conversations.fields import ConversationFields
from distill.methods.async_fields import AsyncFields
from distill.objectives import StepContext
from distill.objectives.student import StudentObjective
from distill.teachers.build import teachers_of
from distill.training.metrics import MetricWindow, new_window, record_micro_batch
from distill.training.runtime import phase_clock
from distill.training.teacher_prefetch import score_step_ahead

if TYPE_CHECKING:
    from distill.training.recipe import Assembly


def step_window(parts: Assembly) -> MetricWindow:
    """An empty window of the run's metrics: the method's, per teacher, and the rollout's."""
    return new_window(parts.method, list(teachers_of(parts.teacher)), list(parts.rollout.metric_names()))


def step_passes(parts: Assembly, model: nn.Module, step: int, window: MetricWindow, timings: dict[str, float],
                log_step: bool) -> float:
    """Step `step`'s rollout, its teacher signals and the student's forward and backward passes through `model` (the
    wrapped objective): gradients accumulated, nothing stepped. Returns the step's trained tokens (all processes)."""
    config, accelerator, runtime, rollout = parts.config, parts.accelerator, parts.runtime, parts.rollout
    rollout.request(step)
    micro_batches = rollout.take(step, timings)
    for name, (numerator, denominator) in rollout.take_stage_metrics().items():
        window.add_mean(name, numerator, denominator)
    counts = getattr(parts.objective, "step_counts", {})  # what the objective needs summed over the step
    step_tokens, step_rows, *step_counts = runtime.global_sums(
        [sum(mb.num_completion_tokens for mb in micro_batches), sum(mb.num_rows for mb in micro_batches),
         *(sum(count(mb) for mb in micro_batches) for count in counts.values())])
    scale = runtime.num_processes / step_tokens if step_tokens else 0.0
    sizes: dict[str, Any] = dict(step_tokens=step_tokens, step_rows=step_rows, step_counts=dict(zip(counts, step_counts)),
                 step_micro_batches=len(micro_batches) * runtime.num_processes)
    # A teacher outside the process scores the whole step up front; a model here, each micro-batch before its loss.
    teacher = parts.teacher
    remote_signals = (score_step_ahead(teacher, micro_batches, config.temperature, runtime, timings)
                      if parts.location.scores_ahead else None)
    for index, mb in enumerate(micro_batches):
        mb = mb.to(parts.device)
        if remote_signals is not None:
            signal = remote_signals[index]
        elif teacher is None:  # a method without a teacher (sft)
            signal = None
        else:
            start = phase_clock(parts.device)
            signal = teacher.score(mb, config.temperature)
            timings["teacher"] = timings.get("teacher", 0.0) + phase_clock(parts.device) - start
        start = phase_clock(parts.device)
        with _gradient_sync(parts, model, index == len(micro_batches) - 1), accelerator.autocast():
            # The weights this step trains are version `step` (optimizer steps applied): a micro-batch sampled
            # by an older version is stale (`RolloutProducer`).
            context = StepContext(mb.source, log_step, staleness=mb.staleness(step), **sizes)
            out = model(mb, signal, parts.objective, context)
            accelerator.backward(out.loss_sum * scale)
        timings["student"] = timings.get("student", 0.0) + phase_clock(parts.device) - start
        record_micro_batch(window, mb, out, log_step, parts.method, step if AsyncFields.of(config).max_staleness else None)
        timings["tokens_scored"] = timings.get("tokens_scored", 0.0) + mb.num_completion_tokens
    return step_tokens


def _gradient_sync(parts: Assembly, model: nn.Module, last_micro_batch: bool):
    """DDP averages gradients over processes once per step, in the backward of its last micro-batch. FSDP
    reduce-scatters every micro-batch's: skipping it would hold full-size unsharded gradients meanwhile."""
    if parts.config.fsdp or last_micro_batch:
        return contextlib.nullcontext()
    return parts.accelerator.no_sync(model)


class StepTimer:
    """The run's steps as `distill doctor` measures them, before set-up (`distill.doctor.context.StepTimer`)."""

    def __init__(self, parts: Assembly, runs_tools: bool = False):
        self._parts, self._runs_tools = parts, runs_tools

    def tool_stand_in(self) -> str | None:
        """What answered the timed steps' tool calls in place of the tools (None: the tools ran, or there are none)."""
        talk = ConversationFields.of(self._parts.config)
        return None if self._runs_tools or not (talk.tools or talk.environment is not None) else STAND_IN

    def generated_sources(self) -> list[list[str]]:
        """Per optimizer step, the sources of the micro-batches whose completions it generates ([] for a step that
        reuses an earlier step's rollout): what a run's generation amounts to, drawn without generating anything."""
        rollout = self._parts.rollout
        return [rollout.sources(step) if rollout.generation_step(step) == step else []
                for step in range(self._parts.config.max_steps)]

    def time_step(self, step: int) -> dict[str, float]:
        """Step `step` run as training runs it, timed by phase (`step_passes`' timings: generation by source, the
        teacher, the student's passes; the micro-batches each source generated), plus "optimizer": an AdamW step over
        the student's gradients. What `distill doctor`'s time estimate extrapolates from. The weights do not move (the
        optimizer step runs at learning rate 0) and the gradients are dropped. No tool or environment runs unless
        `runs_tools`: a stand-in answers their calls (`distill.conversations.calls.STAND_IN`)."""
        parts = self._parts
        model = StudentObjective(parts.student_model, parts.vocab_size)
        timings: dict[str, float] = {}
        stand_in = contextlib.nullcontext() if self._runs_tools else parts.rollout.tools_stood_in()
        try:
            with stand_in:
                step_passes(parts, model, step, step_window(parts), timings, log_step=False)
            trained = [p for p in model.parameters() if p.grad is not None]
            start = phase_clock(parts.device)
            torch.optim.AdamW(trained, lr=0.0, weight_decay=0.0).step()
            timings["optimizer"] = phase_clock(parts.device) - start
        finally:
            model.zero_grad(set_to_none=True)
        return timings
