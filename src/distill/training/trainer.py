"""The training loop: one loop on accelerate for every method.

One optimizer step:
  1. the method's source plan draws each micro-batch's completion source (identical on every process);
  2. take the whole step's rollout from the producer (`distill.training.plan.RolloutProducer`: `StepRollout`
     generates it then, `AsyncRollout` had its student samples drawn ahead in a worker thread): the student's samples for the on-policy
     micro-batches, the teacher's for the seq_kd ones, dataset completions for the rest;
  3. count the step's completion tokens over all micro-batches and processes (one all-reduce);
  4. per micro-batch: the teacher's signal, the student's forward + the method's objective, backward of
     loss_sum * num_processes / step_tokens (DDP averages gradients over processes, hence the factor);
  5. clip, step, schedule, the method's step hooks; metrics accumulate as sums and are reduced once per
     logging step.
The loss, and so the gradient, does not depend on how the step's tokens are split into micro-batches or
processes (checked by the split-invariance tests). What is learned is the method's (`distill.methods`); where the
teacher lives is the location's (`distill.locations`), chosen by the config's `teacher` / `teacher_url` / `teacher_cache`.
"""

from __future__ import annotations

import errno
import sys
import time
from pathlib import Path
from typing import Any

from torch import nn

from distill.config import DistillConfig
from distill.doctor.report import ChecksFailed
from distill.doctor.setup_problems import SetupProblems
from distill.errors import StepFailure
from distill.evaluation.evaluator import Evaluator, eval_settings
from distill.generation.registry import close_engine
from distill.models import sharding
from distill.rundir import checkpoint as ckpt
from distill.rundir.directory import disk_full_message, disk_is_full
from distill.training.metrics import MetricWindow, add_throughput, log_record, progress_bar, show_on_progress_bar
from distill.training.plan import RolloutProducer
from distill.training.recipe import Assembly, Given, assemble
from distill.training.runtime import StopRequest
from distill.training.start_checks import start_checks
from distill.training.state import TrainingState, prepare_training
from distill.training.step import step_passes, step_window


class Distiller:
    """Distil `teacher` into `student` as `config` says; models, tokenizer and datasets may be objects.

    Everything that can be checked without loading a model (config, datasets, output directory and its
    lock, model paths and files) is checked in the constructor before any model is loaded. A lock left by a
    run that is gone on this host is taken over; `break_lock` takes over one another host left too. A teacher model
    object passed without `teacher_tokenizer` is taken to share `tokenizer`, which holds only if its lm_head
    has the student's rows (otherwise an error asks for `teacher_tokenizer`).

    The constructor assembles the run (`parts`: `distill.training.recipe.Assembly`) and runs the start-of-run checks
    on it (`findings`); `setup` prepares the training state (`state`: `distill.training.state.TrainingState`); `train`
    loops. Nothing else is held here.
    """

    def __init__(self, config: DistillConfig, *, student: nn.Module | str | None = None, teacher: nn.Module | str | None = None,
                 tokenizer: Any = None, teacher_tokenizer: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 resume: bool = False, break_lock: bool = False, doctor: bool = False, doctor_runs_tools: bool = False):
        """config: the run (`DistillConfig`; validated here, the method's defaults filled in). student, teacher: a
        model object or a spec (a directory, a .gguf file, a hub id, a bundled name) in place of the config's
        fields; tokenizer, teacher_tokenizer: theirs, needed with model objects. train_dataset, eval_dataset: a
        `datasets.Dataset` (or a spec) in place of `dataset` / `eval_dataset`. resume: continue from the run
        directory's last checkpoint. break_lock: take over a lock another host left. doctor: built by `distill doctor`,
        which runs the slower checks too and prints the findings itself; its timed step calls no tool and makes no
        environment (a stand-in answers) unless `doctor_runs_tools`."""
        given = Given(student, teacher, tokenizer, teacher_tokenizer, train_dataset, eval_dataset, resume, break_lock)
        # The set-up's problems stop a run at the first; doctor keeps those nothing later builds on, and goes on.
        problems = SetupProblems(collect=doctor)
        try:
            parts, models = assemble(config.validate(), given, problems)  # validated: the method's defaults filled in
        except (ValueError, StepFailure) as error:
            if not doctor or isinstance(error, ChecksFailed):
                raise
            raise problems.stopped(error) from error
        self.parts: Assembly = parts
        # What users trip over (`distill.doctor`): errors (and warnings with strict_checks) stop here, before any file.
        self.findings = start_checks(parts, models, doctor, problems.findings, doctor_runs_tools)
        self.state: TrainingState | None = None  # made by setup()

    # Read most often by callers (tests, benchmarks): the student as it trains, the teacher, the rollout.
    @property
    def student_model(self) -> nn.Module:
        return self.parts.student_model

    @property
    def teacher(self):
        """The teacher that scores training steps (None for a method without a teacher signal)."""
        return self.parts.teacher

    @property
    def rollout(self) -> RolloutProducer:
        return self.parts.rollout

    # ---------------------------------------------------------------------------------------- train --
    def setup(self) -> int:
        """Build optimizer and schedule, wrap the student for accelerate, prepare the run directory and
        restore a checkpoint when resuming (`distill.training.state`). Returns the first step to run. Called by
        `train`."""
        self.state = prepare_training(self.parts, self.findings, self.state)
        return self.state.first_step

    def train(self) -> dict[str, Any]:
        """Run the configured number of steps; returns {"train": last metrics, "eval": report metrics}."""
        parts = self.parts
        try:
            return self._train()
        except (OSError, RuntimeError) as error:
            if disk_is_full(error, parts.run_dir):
                raise OSError(errno.ENOSPC, disk_full_message(parts.run_dir, error)) from error
            raise
        finally:
            try:
                parts.rollout.close()
                parts.location.close(parts.teachers)
                close_engine(parts.config.generation_engine)
            finally:
                if self.state is not None:
                    self.state.run.release()

    def _train(self) -> dict[str, Any]:
        step = self.setup()
        evaluator = self.evaluator()
        try:
            return self._steps(step, evaluator)
        finally:
            if evaluator is not None:
                evaluator.close()  # its tool workers

    def _steps(self, step: int, evaluator: Evaluator | None) -> dict[str, Any]:
        """Evaluate, train from `step` to the end (or an interrupt), checkpoint, evaluate again."""
        parts, config, state = self.parts, self.parts.config, self._state()
        before = parts.with_student(lambda student: state.run.evaluate_before(evaluator, student))
        last_record: dict[str, Any] = {}
        progress = progress_bar(config.progress_bar and parts.runtime.is_main_process, config.max_steps, step)
        window, timings = self._new_window(), dict[str, float]()
        stop, interrupted, started = StopRequest(), False, time.perf_counter()
        with stop.installed():
            try:
                while step < config.max_steps:
                    self._train_step_or_checkpoint(step, window, timings)
                    step += 1
                    if step % config.logging_steps == 0 or step == config.max_steps:
                        last_record = self._log(step, window, timings, progress)
                        window, timings = self._new_window(), {}
                    if config.save_steps and step % config.save_steps == 0 and step < config.max_steps:
                        self.save_checkpoint(step)
                    if progress is not None:
                        progress.update(1)
                    # Interrupts and the time budget are acted on here, between steps, by every process at once.
                    time_up = bool(config.max_time_minutes) and time.perf_counter() - started >= 60.0 * config.max_time_minutes
                    interrupted, time_up = parts.runtime.agree([stop.requested, time_up])
                    if interrupted:
                        break
                    if time_up and step < config.max_steps:
                        if step % config.logging_steps:
                            last_record = self._log(step, window, timings, progress)
                        break
            finally:
                if progress is not None:
                    progress.close()
        if interrupted:
            path = self.save_checkpoint(step)
            if parts.runtime.is_main_process:
                print(f"interrupted: saved {path}; continue with `distill train --resume {parts.run_dir}`", file=sys.stderr)
            raise KeyboardInterrupt
        self.save_checkpoint(step)
        metrics = state.run.finish(step, state.trained, evaluator, before)
        if config.report_to != "none":
            parts.accelerator.end_training()
        return {"train": last_record, "eval": metrics, "steps": step, "run_dir": str(parts.run_dir)}

    def _train_step_or_checkpoint(self, step: int, window: MetricWindow, timings: dict[str, float]) -> None:
        """One step; when it fails for a reason outside distill (`StepFailure`: the teacher server, a reward
        function), checkpoint the state from before the step and stop."""
        config, rollout = self.parts.config, self.parts.rollout
        log_step = (step + 1) % config.logging_steps == 0 or step + 1 == config.max_steps
        rng, reused = ckpt.rng_state(), rollout.restore_point()
        try:
            self.train_step(step, window, timings, log_step=log_step)
        except StepFailure as error:
            self._state().optimizer.zero_grad(set_to_none=True)
            ckpt.set_rng_state(rng)
            rollout.load_state_dict(reused)  # a rollout generated by the failed step is generated again
            path = self.save_checkpoint(step)
            raise type(error)(f"{error}\nThe run is checkpointed at step {step} ({path}); {error.resume_hint}, "
                              f"continue with `distill train --resume {self.parts.run_dir}`") from error

    def train_step(self, step: int, window: MetricWindow, timings: dict[str, float], log_step: bool) -> None:
        """Step `step` (`distill.training.step.step_passes`), then clip, step, schedule and the step hooks."""
        config, state = self.parts.config, self._state()
        step_tokens = step_passes(self.parts, state.wrapped, step, window, timings, log_step)
        max_norm = config.max_grad_norm or float("inf")
        grad_norm = (sharding.clip_grad_norm(state.wrapped, max_norm) if config.fsdp
                     else self.parts.accelerator.clip_grad_norm_(state.wrapped.parameters(), max_norm))
        if step_tokens:  # a step without a trained token (every completion empty) moves nothing, the schedule neither
            state.optimizer.step()
            state.scheduler.step()
        state.optimizer.zero_grad(set_to_none=True)
        for hook in state.hooks:
            hook.after_optimizer_step(step)
        window.add_mean("grad_norm", float(grad_norm), 1.0)
        window.add_mean("learning_rate", state.scheduler.get_last_lr()[0], 1.0)

    def _state(self) -> TrainingState:
        if self.state is None:
            raise RuntimeError("Distiller.setup() has not run: train() calls it, or call it before stepping by hand")
        return self.state

    # ------------------------------------------------------------------------------------- metrics --
    def _new_window(self) -> MetricWindow:
        return step_window(self.parts)

    def _log(self, step: int, window: MetricWindow, timings: dict[str, float], progress) -> dict[str, Any]:
        parts = self.parts
        add_throughput(window, timings)
        for name, (total, steps) in parts.rollout.take_producer_metrics().items():
            window.add_mean(name, total, steps)
        epoch = parts.rollout.generations(step) * parts.sampler.prompts_per_step / len(parts.train_examples)
        record = log_record(step, epoch, window.reduce(parts.device))
        record.update(parts.plan.logged(parts.rollout.generation_step(step - 1)))  # GKD's lmbda
        self._state().metrics_log.write(record)
        if parts.config.report_to != "none":
            parts.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=step)
        show_on_progress_bar(progress, record)
        return record

    # ------------------------------------------------------------------------------- run directory --
    def save_checkpoint(self, step: int) -> Path:
        state = self._state()
        return state.run.save_checkpoint(step, state.trained)

    def evaluator(self) -> Evaluator | None:
        """The run's held-out evaluation (its teacher's samples and answers computed once), on the main process;
        None without held-out prompts. `train` evaluates the student with it before and after."""
        parts = self.parts
        if not parts.eval_examples or not parts.runtime.is_main_process:
            return None
        assert parts.teachers.eval is not None  # every location that evaluates builds its evaluation teacher
        return Evaluator(parts.teachers.eval, parts.tokenizer, parts.encoder, parts.eval_examples, parts.vocab_size,
                         parts.eos_ids, parts.pad_id, parts.device, eval_settings(parts.config, parts.method, parts.encoder))
