"""The training state: what set-up prepares from the run's assembly before the first step, top to bottom.

    _seed_process_stream   each process its own random stream (student sampling draws from it)
    _setup_optimization    the student's objective (sharded under FSDP), AdamW and its schedule, wrapped by accelerate
    _setup_hooks           the method's, the location's and the rollout's step hooks; an engine's weight sync
    _setup_run_directory   the run directory locked, prepared and given the start-of-run checks' findings
    then: the checkpoint restored (when resuming), the engine's first weights, the rollout's worker, the trackers.

The order is the run's and moves numbers when changed: seeding first, the hooks once the student is wrapped (they
read it as it trains), the checkpoint before the weights an engine samples from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from distill.doctor.report import write_findings
from distill.generation.registry import configure_engine
from distill.generation.sync import weight_sync
from distill.methods.async_fields import AsyncFields
from distill.models import sharding
from distill.objectives.student import StudentObjective
from distill.rundir.directory import RunDirectory, RunIdentity, TrainedStudent
from distill.rundir.metrics_log import MetricsLog
from distill.seeds import process_seed
from distill.training.assembly import make_optimizer

if TYPE_CHECKING:
    from distill.doctor.findings import Finding
    from distill.training.recipe import Assembly


@dataclass(frozen=True)
class TrainingState:
    """What the loop steps: `trained` (the wrapped student objective, optimizer, schedule and step hooks: what a
    checkpoint saves and restores), the run directory and its metrics log, and the first step to run (0, or the
    resumed checkpoint's)."""

    trained: TrainedStudent
    run: RunDirectory
    metrics_log: MetricsLog
    first_step: int

    @property
    def wrapped(self) -> nn.Module:
        return self.trained.wrapped

    @property
    def optimizer(self) -> Any:
        return self.trained.optimizer

    @property
    def scheduler(self) -> Any:
        return self.trained.scheduler

    @property
    def hooks(self) -> list:
        return self.trained.hooks


def prepare_training(parts: Assembly, findings: list[Finding], previous: TrainingState | None) -> TrainingState:
    """The training state of `parts`; `previous`: the state of an earlier set-up of the same run (train after a
    manual `setup`), whose sharded student is kept and whose lock is released."""
    _seed_process_stream(parts)
    wrapped, optimizer, scheduler = _setup_optimization(parts, previous)
    hooks, sync = _setup_hooks(parts)
    run, metrics_log = _setup_run_directory(parts, findings, previous)
    trained = TrainedStudent(wrapped, parts.with_student, parts.tokenizer, optimizer, scheduler, hooks)
    try:
        first_step = run.resume(trained) if parts.resuming else 0
        if sync is not None:
            sync.start()  # the weights the first rollout samples from (a resumed run's: the checkpoint's)
        parts.rollout.start(first_step)  # an asynchronous producer's worker starts here
        if parts.config.report_to != "none":
            parts.accelerator.init_trackers(parts.config.run_name or parts.run_dir.name, config=parts.config_record())
    except BaseException:
        run.release()  # no state holds the lock yet: a checkpoint refused on resume leaves the directory free
        raise
    return TrainingState(trained, run, metrics_log, first_step)


def _seed_process_stream(parts: Assembly) -> None:
    """Each process its own stream (`distill.seeds.process_seed`; process 0 keeps the seed's): student sampling
    draws from it."""
    from transformers import set_seed

    set_seed(process_seed(parts.config.seed, parts.runtime.process_index))


def _setup_optimization(parts: Assembly, previous: TrainingState | None) -> tuple[nn.Module, Any, Any]:
    """(the student's objective as accelerate or FSDP wraps it, the optimizer, the schedule); the student is told
    what it now trains inside (`StudentAccess.attach`)."""
    config = parts.config
    parts.student_model.train()  # from_pretrained returns eval mode: no dropout, no activation checkpointing
    if config.fsdp and previous is not None:  # set up again: the student is sharded already
        objective = previous.wrapped
    else:
        objective = StudentObjective(parts.student_model, parts.vocab_size)
    if config.fsdp and not sharding.is_sharded(objective):  # in place, before the optimizer sees the parameters
        sharding.shard(objective, parts.student_model)
    # The schedule is not prepared by accelerate: its wrapper would step it once per process.
    optimizer, scheduler = make_optimizer(config, [p for p in objective.parameters() if p.requires_grad])
    if config.fsdp:
        wrapped, optimizer = objective, parts.accelerator.prepare(optimizer)
    else:
        wrapped, optimizer = parts.accelerator.prepare(objective, optimizer)
    parts.with_student.attach(wrapped)
    return wrapped, optimizer, scheduler


def _setup_hooks(parts: Assembly) -> tuple[list, Any]:
    """(the step hooks, checkpointed with the run; the engine's weight sync among them, or None)."""
    config = parts.config
    hooks = list(parts.method.hooks(config, parts.with_student.current(), parts.teacher))
    hooks += parts.location.hooks(parts.teachers)
    if parts.rollout.holds_state():  # what the producer holds (a reused rollout) is checkpointed by it, as a hook
        hooks.append(parts.rollout)
    configure_engine(config)  # an engine's own settings (vLLM's KV cache), before its first decode
    # An engine with its own weights is synced after each step; an asynchronous producer pushes them itself.
    sync = None if AsyncFields.of(config).max_staleness else weight_sync(config.generation_engine, parts.with_student,
                                                         parts.teachers.sampling_models)
    if sync is not None:
        hooks.append(sync)
    return hooks, sync


def _setup_run_directory(parts: Assembly, findings: list[Finding],
                         previous: TrainingState | None) -> tuple[RunDirectory, MetricsLog]:
    if previous is not None:  # set up again (train after a manual setup): this run's own lock
        previous.run.release()
    run = RunDirectory(parts.run_dir, parts.runtime, parts.config, parts.config_record(),
                       RunIdentity(parts.method, parts.location), parts.break_lock)
    metrics_log = run.prepare(parts.resuming)
    if parts.runtime.is_main_process:
        write_findings(parts.run_dir, findings)
    return run, metrics_log
