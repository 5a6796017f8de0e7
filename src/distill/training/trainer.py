"""The training loop: one loop on accelerate for every method.

One optimizer step:
  1. the method's source plan draws each micro-batch's completion source (identical on every process);
  2. roll out the whole step (`distill.training.rollout.StepRollout`): one student `generate` for the on-policy
     micro-batches, one teacher `generate` for the seq_kd ones, dataset completions for the rest;
  3. count the step's completion tokens over all micro-batches and processes (one all-reduce);
  4. per micro-batch: the teacher's signal, the student's forward + the method's objective, backward of
     loss_sum * num_processes / step_tokens (DDP averages gradients over processes, hence the factor);
  5. clip, step, schedule, the method's step hooks; metrics accumulate as sums and are reduced once per
     logging step.
The loss, and so the gradient, does not depend on how the step's tokens are split into micro-batches or
processes (DESIGN.md §4.1). What is learned is the method's (`distill.methods`); where the teacher lives is
the location's (`distill.locations`), chosen by the config's `teacher` / `teacher_url` / `teacher_cache`.
"""

from __future__ import annotations

import contextlib
import errno
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from distill.config import DistillConfig
from distill.conversations.setup import tool_loop
from distill.conversations.support import check_conversation_rows
from distill.doctor.context import DoctorContext
from distill.doctor.report import act_on, write_findings
from distill.doctor.run import run_checks
from distill.errors import StepFailure
from distill.evaluation.evaluator import EvalSettings, Evaluator
from distill.generation.registry import close_engine, configure_engine
from distill.generation.sync import weight_sync
from distill.locations import location_of
from distill.methods import get_method
from distill.methods.registry import StageParts
from distill.objectives import StepContext
from distill.objectives.student import StudentObjective
from distill.rundir import checkpoint as ckpt
from distill.rundir.directory import (
    RunDirectory,
    check_objects_given,
    check_output_dir,
    disk_full_message,
    disk_is_full,
    run_inputs,
)
from distill.teachers.ahead import score_step_ahead
from distill.teachers.build import teachers_of
from distill.training import sharding
from distill.training.assembly import (
    check_arguments,
    check_images_before_loading,
    load_examples,
    load_models,
    make_optimizer,
    make_sampler,
    prepare_models,
    rollout_producer,
    rollout_settings,
    student_source,
)
from distill.training.metrics import (
    MetricWindow,
    add_throughput,
    log_record,
    new_window,
    progress_bar,
    record_micro_batch,
    show_on_progress_bar,
)
from distill.training.rollout import RolloutProducer
from distill.training.runtime import StopRequest, phase_clock, start_runtime
from distill.training.student_access import StudentAccess


class Distiller:
    """Distil `teacher` into `student` as `config` says; models, tokenizer and datasets may be objects.

    Everything that can be checked without loading a model (config, datasets, output directory and its
    lock, model paths and files) is checked in the constructor before any model is loaded. A lock left by a
    run that is gone on this host is taken over; `break_lock` takes over one another host left too. A teacher model
    object passed without `teacher_tokenizer` is taken to share `tokenizer`, which holds only if its lm_head
    has the student's rows (otherwise an error asks for `teacher_tokenizer`).
    """

    def __init__(self, config: DistillConfig, *, student: nn.Module | str | None = None, teacher: nn.Module | str | None = None,
                 tokenizer: Any = None, teacher_tokenizer: Any = None, train_dataset: Any = None, eval_dataset: Any = None,
                 resume: bool = False, break_lock: bool = False, doctor: bool = False):
        """config: the run (`DistillConfig`; validated here, the method's defaults filled in). student, teacher: a
        model object or a spec (a directory, a .gguf file, a hub id, a bundled name) in place of the config's
        fields; tokenizer, teacher_tokenizer: theirs, needed with model objects. train_dataset, eval_dataset: a
        `datasets.Dataset` (or a spec) in place of `dataset` / `eval_dataset`. resume: continue from the run
        directory's last checkpoint. break_lock: take over a lock another host left. doctor: built by `distill doctor`,
        which runs the slower checks too and prints the findings itself."""
        self.config = config = config.validate()  # resolved: the method's defaults filled in
        self.method = get_method(config.method)
        self.plan = self.method.sources(config)
        self.location = location_of(config, self.method)
        self.resuming = resume
        self.break_lock = break_lock  # take over a run.lock another host left (`distill.rundir.lock`)
        given = {"student": student, "teacher": teacher, "dataset": train_dataset, "eval_dataset": eval_dataset}
        self.objects_given = {name: type(value).__name__ for name, value in given.items()
                              if value is not None and not isinstance(value, str)}
        self.run_dir = Path(config.output_dir)
        self.wrapped = self.optimizer = self.scheduler = self.run = None  # made by setup()
        check_arguments(config, self.location, teacher, teacher_tokenizer, eval_dataset)
        if resume:
            check_objects_given(config, {name for name, value in given.items() if value is not None})
        self.train_examples, self.eval_examples = load_examples(config, self.method, train_dataset, eval_dataset)
        self.location.check_dataset(config, self.method, self.plan.possible(), self.train_examples)
        check_conversation_rows(self.method, self.plan.possible(), self.train_examples, "dataset",
                                bool(config.tools) or config.environment is not None)
        check_output_dir(self.run_dir, config.overwrite_output_dir, run_inputs(config, self.location), resuming=resume,
                         break_lock=break_lock)
        teacher_source = self.location.model_source(config, teacher)
        student = student_source(config, self.location, student)  # None: the student starts from the teacher's weights
        check_images_before_loading(self.train_examples + self.eval_examples, student if student is not None else teacher_source)

        self.objective = self.method.objective(config)
        self.runtime = start_runtime(config, str(self.run_dir))
        self.accelerator, self.device = self.runtime.accelerator, self.runtime.device
        self.sampler = make_sampler(config, self.method, self.runtime, len(self.train_examples))
        models = load_models(self.location, self.method, student, teacher_source, tokenizer, teacher_tokenizer)
        # A student of its own (given, or the location's default model) keeps all its layers unless student_init says.
        prepared = prepare_models(config, self.method, self.location, self.runtime, models, student is not None,
                                  self.train_examples, self.eval_examples)
        self.student_model, self.tokenizer, self.encoder, self.encoded = (prepared.student, prepared.tokenizer,
                                                                          prepared.encoder, prepared.encoded)
        self.vocab_size, self.eos_ids, self.pad_id = prepared.against.vocab_size, prepared.against.eos_ids, prepared.against.pad_id
        self.teachers = prepared.teachers  # kept whole: train and eval
        self.with_student = StudentAccess(self.student_model, config.fsdp, self.accelerator.unwrap_model)
        # The method's work on each rollout before any loss (sdpo's rewards), if it has one.
        self.stage = self.method.stage(config, StageParts(self.tokenizer, self.eos_ids, self.runtime, self.sampler.first_row,
                                                                 self.student_model))
        self.rollout: RolloutProducer = rollout_producer(
            config, self.plan, self.sampler, self.train_examples, self.encoded,
            rollout_settings(config, self.method, self.teacher, self.encoder), self.with_student, self.teacher, self.eos_ids,
            self.pad_id, self.vocab_size, self.device, self.runtime.process_index, self.stage)
        # What users trip over (`distill.doctor`): errors (and warnings with strict_checks) stop here, before any file.
        head = getattr(prepared.teachers.train, "head", None) if models.teacher is None else None  # a hidden-state payload's
        self.findings = run_checks(DoctorContext(config, self.method, self.train_examples, self.student_model, self.tokenizer,
                                                 models.teacher, models.teacher_tokenizer, student is not None, self.eos_ids,
                                                 self.encoded, doctor, head, self.time_step, self.generated_sources))
        act_on(self.findings, config.strict_checks, show=not doctor and self.runtime.is_main_process)

    @property
    def teacher(self):
        """The teacher that scores training steps (None for a method without a teacher signal)."""
        return self.teachers.train

    @property
    def eval_teacher(self):
        return self.teachers.eval

    def sources_for_step(self, step: int) -> list[str]:
        return self.rollout.sources(step)

    def generated_sources(self) -> list[list[str]]:
        """Per optimizer step, the sources of the micro-batches whose completions it generates ([] for a step that
        reuses an earlier step's rollout): what a run's generation amounts to, drawn without generating anything."""
        return [self.rollout.sources(step) if self.rollout.generation_step(step) == step else []
                for step in range(self.config.max_steps)]

    def time_step(self, step: int) -> dict[str, float]:
        """Step `step` run as training runs it, timed by phase (`step_passes`' timings: generation by source, the
        teacher, the student's passes; the micro-batches each source generated), plus "optimizer": an AdamW step over
        the student's gradients. What `distill doctor`'s time estimate extrapolates from. The weights do not move (the
        optimizer step runs at learning rate 0) and the gradients are dropped."""
        model = self.wrapped if self.wrapped is not None else StudentObjective(self.student_model, self.vocab_size)
        timings: dict[str, float] = {}
        try:
            self.step_passes(model, step, self._new_window(), timings, log_step=False)
            trained = [p for p in model.parameters() if p.grad is not None]
            start = phase_clock(self.device)
            torch.optim.AdamW(trained, lr=0.0, weight_decay=0.0).step()
            timings["optimizer"] = phase_clock(self.device) - start
        finally:
            model.zero_grad(set_to_none=True)
        return timings

    def student_for_generation(self) -> nn.Module:
        return self.with_student.current()

    # ---------------------------------------------------------------------------------------- train --
    def setup(self) -> int:
        """Build optimizer and schedule, wrap the student for accelerate, prepare the run directory and
        restore a checkpoint when resuming. Returns the first step to run. Called by `train`."""
        from transformers import set_seed

        config, accelerator = self.config, self.accelerator
        # Each process its own stream (process 0 keeps the seed's): student sampling draws from it, and processes
        # that hold the same prompt (a group spread over processes) must not draw the same completions.
        set_seed((config.seed + 1_000_003 * self.runtime.process_index) % 2**32)
        self.student_model.train()  # from_pretrained returns eval mode: no dropout, no activation checkpointing
        if config.fsdp and self.wrapped is not None:  # setup called again: the student is sharded already
            objective = self.wrapped
        else:
            objective = StudentObjective(self.student_model, self.vocab_size)
        if config.fsdp and not sharding.is_sharded(objective):  # in place, before the optimizer sees the parameters
            sharding.shard(objective, self.student_model)
        # The schedule is not prepared by accelerate: its wrapper would step it once per process.
        optimizer, self.scheduler = make_optimizer(config, [p for p in objective.parameters() if p.requires_grad])
        if config.fsdp:
            self.wrapped, self.optimizer = objective, accelerator.prepare(optimizer)
        else:
            self.wrapped, self.optimizer = accelerator.prepare(objective, optimizer)
        self.with_student.attach(self.wrapped)
        self.hooks = list(self.method.hooks(config, self.student_for_generation(), self.teacher))
        self.hooks += self.location.hooks(self.teachers)  # checkpointed with the run
        if self.rollout.holds_state():  # what the producer holds (a reused rollout) is checkpointed by it, as a hook
            self.hooks.append(self.rollout)
        configure_engine(config)  # an engine's own settings (vLLM's KV cache), before its first decode
        # An engine with its own weights is synced after each step; an asynchronous producer pushes them itself.
        sync = None if config.max_staleness else weight_sync(config.generation_engine, self.with_student,
                                                             self.teachers.sampling_models)
        if sync is not None:
            self.hooks.append(sync)
        if self.run is not None:  # setup called again (train after a manual setup): this Distiller's own lock
            self.run.release()
        self.run = RunDirectory(self.run_dir, self.runtime, config, self.config_record(), self.break_lock)
        self.metrics_log = self.run.prepare(self.resuming)
        if self.runtime.is_main_process:
            write_findings(self.run_dir, self.findings)
        start_step = 0
        if self.resuming:
            start_step = self.run.resume(self.wrapped, self.student_for_generation(), self.optimizer, self.scheduler, self.hooks)
        if sync is not None:
            sync.start()  # the weights the first rollout samples from (a resumed run's: the checkpoint's)
        self.rollout.start(start_step)  # an asynchronous producer's worker starts here
        if config.report_to != "none":
            accelerator.init_trackers(config.run_name or self.run_dir.name, config=self.config_record())
        return start_step

    def train(self) -> dict[str, Any]:
        """Run the configured number of steps; returns {"train": last metrics, "eval": report metrics}."""
        try:
            return self._train()
        except (OSError, RuntimeError) as error:
            if disk_is_full(error, self.run_dir):
                raise OSError(errno.ENOSPC, disk_full_message(self.run_dir, error)) from error
            raise
        finally:
            try:
                self.rollout.close()
                self.location.close(self.teachers)
                close_engine(self.config.generation_engine)
            finally:
                if self.run is not None:
                    self.run.release()

    def _train(self) -> dict[str, Any]:
        config = self.config
        step = self.setup()
        evaluator = self.evaluator()
        before = self.with_student(lambda student: self.run.evaluate_before(evaluator, student))
        last_record: dict[str, Any] = {}
        progress = progress_bar(config.progress_bar and self.runtime.is_main_process, config.max_steps, step)
        window, timings = self._new_window(), {}
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
                    interrupted, time_up = self.runtime.agree([stop.requested, time_up])
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
            if self.runtime.is_main_process:
                print(f"interrupted: saved {path}; continue with `distill train --resume {self.run_dir}`", file=sys.stderr)
            raise KeyboardInterrupt
        self.save_checkpoint(step)
        metrics = self.run.finish(step, evaluator, before, self.wrapped, self.student_for_generation(), self.tokenizer, self.method,
                                  self.location, self.with_student)
        if config.report_to != "none":
            self.accelerator.end_training()
        return {"train": last_record, "eval": metrics, "steps": step, "run_dir": str(self.run_dir)}

    def _train_step_or_checkpoint(self, step: int, window: MetricWindow, timings: dict[str, float]) -> None:
        """One step; when it fails for a reason outside distill (`StepFailure`: the teacher server, a reward
        function), checkpoint the state from before the step and stop."""
        log_step = (step + 1) % self.config.logging_steps == 0 or step + 1 == self.config.max_steps
        rng, reused = ckpt.rng_state(), self.rollout.restore_point()
        try:
            self.train_step(step, window, timings, log_step=log_step)
        except StepFailure as error:
            self.optimizer.zero_grad(set_to_none=True)
            ckpt.set_rng_state(rng)
            self.rollout.load_state_dict(reused)  # a rollout generated by the failed step is generated again
            path = self.save_checkpoint(step)
            raise type(error)(f"{error}\nThe run is checkpointed at step {step} ({path}); {error.resume_hint}, "
                              f"continue with `distill train --resume {self.run_dir}`") from error

    def train_step(self, step: int, window: MetricWindow, timings: dict[str, float], log_step: bool) -> None:
        config, accelerator = self.config, self.accelerator
        step_tokens = self.step_passes(self.wrapped, step, window, timings, log_step)
        max_norm = config.max_grad_norm or float("inf")
        grad_norm = (sharding.clip_grad_norm(self.wrapped, max_norm) if config.fsdp
                     else accelerator.clip_grad_norm_(self.wrapped.parameters(), max_norm))
        if step_tokens:  # a step without a trained token (every completion empty) moves nothing, the schedule neither
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        for hook in self.hooks:
            hook.after_optimizer_step(step)
        window.add_mean("grad_norm", float(grad_norm), 1.0)
        window.add_mean("learning_rate", self.scheduler.get_last_lr()[0], 1.0)

    def step_passes(self, model: nn.Module, step: int, window: MetricWindow, timings: dict[str, float],
                    log_step: bool) -> float:
        """Step `step`'s rollout, its teacher signals and the student's forward and backward passes through `model` (the
        wrapped objective): gradients accumulated, nothing stepped. Returns the step's trained tokens (all processes)."""
        config, accelerator = self.config, self.accelerator
        self.rollout.request(step)
        micro_batches = self.rollout.take(step, timings)
        for name, (numerator, denominator) in self.rollout.take_stage_metrics().items():
            window.add_mean(name, numerator, denominator)
        counts = getattr(self.objective, "step_counts", {})  # what the objective needs summed over the step
        step_tokens, step_rows, *step_counts = self.runtime.global_sums(
            [sum(mb.num_completion_tokens for mb in micro_batches), sum(mb.num_rows for mb in micro_batches),
             *(sum(count(mb) for mb in micro_batches) for count in counts.values())])
        scale = self.runtime.num_processes / step_tokens if step_tokens else 0.0
        sizes = dict(step_tokens=step_tokens, step_rows=step_rows, step_counts=dict(zip(counts, step_counts)),
                     step_micro_batches=len(micro_batches) * self.runtime.num_processes)
        # A teacher outside the process scores the whole step up front; a model here, each micro-batch before its loss.
        remote_signals = (score_step_ahead(self.teacher, micro_batches, config.temperature, self.runtime, timings)
                          if self.location.scores_ahead else None)
        for index, mb in enumerate(micro_batches):
            mb = mb.to(self.device)
            if remote_signals is not None:
                signal = remote_signals[index]
            elif self.teacher is None:  # a method without a teacher (sft)
                signal = None
            else:
                start = phase_clock(self.device)
                signal = self.teacher.score(mb, config.temperature)
                timings["teacher"] = timings.get("teacher", 0.0) + phase_clock(self.device) - start
            start = phase_clock(self.device)
            with self._gradient_sync(model, index == len(micro_batches) - 1), accelerator.autocast():
                # The weights this step trains are version `step` (optimizer steps applied): a micro-batch sampled
                # by an older version is stale (`RolloutProducer`).
                context = StepContext(mb.source, log_step, staleness=mb.staleness(step), **sizes)
                out = model(mb, signal, self.objective, context)
                accelerator.backward(out.loss_sum * scale)
            timings["student"] = timings.get("student", 0.0) + phase_clock(self.device) - start
            record_micro_batch(window, mb, out, log_step, self.method, step if config.max_staleness else None)
            timings["tokens_scored"] = timings.get("tokens_scored", 0.0) + mb.num_completion_tokens
        return step_tokens

    def _gradient_sync(self, model: nn.Module, last_micro_batch: bool):
        """DDP averages gradients over processes once per step, in the backward of its last micro-batch. FSDP
        reduce-scatters every micro-batch's: skipping it would hold full-size unsharded gradients meanwhile."""
        if self.config.fsdp or last_micro_batch:
            return contextlib.nullcontext()
        return self.accelerator.no_sync(model)

    # ------------------------------------------------------------------------------------- metrics --
    def _new_window(self) -> MetricWindow:
        return new_window(self.method, list(teachers_of(self.teacher)), list(self.rollout.metric_names()))

    def _log(self, step: int, window: MetricWindow, timings: dict[str, float], progress) -> dict[str, Any]:
        add_throughput(window, timings)
        for name, (total, steps) in self.rollout.take_producer_metrics().items():
            window.add_mean(name, total, steps)
        epoch = self.rollout.generations(step) * self.sampler.prompts_per_step / len(self.train_examples)
        record = log_record(step, epoch, window.reduce(self.device))
        record.update(self.plan.logged(self.rollout.generation_step(step - 1)))  # GKD's lmbda
        self.metrics_log.write(record)
        if self.config.report_to != "none":
            self.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=step)
        show_on_progress_bar(progress, record)
        return record

    # ------------------------------------------------------------------------------- run directory --
    def save_checkpoint(self, step: int) -> Path:
        return self.run.save_checkpoint(step, self.wrapped, self.student_for_generation(), self.tokenizer, self.optimizer,
                                        self.scheduler, self.hooks)

    def evaluator(self) -> Evaluator | None:
        """The run's held-out evaluation (its teacher's samples and answers computed once), on the main process;
        None without held-out prompts. `train` evaluates the student with it before and after."""
        if not self.eval_examples or not self.runtime.is_main_process:
            return None
        c = self.config
        settings = EvalSettings(c.eval_max_new_tokens, c.eval_batch_size, c.eval_examples, c.seed, c.loss_chunk_size,
                                c.generation_engine, tuple(getattr(c, f) for f in self.method.template_fields),
                                tool_loop(c, self.encoder, c.eval_max_new_tokens))
        return Evaluator(self.eval_teacher, self.tokenizer, self.encoder, self.eval_examples, self.vocab_size, self.eos_ids,
                         self.pad_id, self.device, settings)

    def config_record(self) -> dict[str, Any]:
        record = self.config.to_dict()
        for name, given in self.objects_given.items():
            record[name] = f"<{given} object>"  # distill.config.io.OBJECT_RECORD: --resume asks for it again
        record["num_processes"] = self.runtime.num_processes
        return record
