"""The training loop: one loop on accelerate for every method.

One optimizer step:
  1. draw each micro-batch's completion source (identical on every process, from (seed, step));
  2. roll out the whole step: one student `generate` for the on-policy micro-batches, one teacher
     `generate` for the seq_kd ones, dataset completions for the rest;
  3. count the step's completion tokens over all micro-batches and processes (one all-reduce);
  4. per micro-batch: teacher hidden states (inference mode), student forward + chunked loss, backward of
     loss_sum * num_processes / step_tokens (DDP averages gradients over processes, hence the factor);
  5. clip, step, schedule; metrics accumulate as sums and are reduced once per logging step.
The loss, and so the gradient, does not depend on how the step's tokens are split into micro-batches or
processes (DESIGN.md §4.1).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.util
import json
import logging
import math
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn

from distill import checkpoint as ckpt
from distill.config import BUNDLED_DATASET, DistillConfig
from distill.data import (
    Example,
    PromptEncoder,
    examples_from_dataset,
    load_dataset_spec,
)
from distill.errors import TeacherServerError
from distill.evaluate import (
    EvalSettings,
    Evaluator,
    build_report,
    summary_lines,
    write_report,
)
from distill.losses import STAT_NAMES
from distill.metrics import MetricsLog, MetricWindow
from distill.model_card import write_model_card
from distill.models import (
    count_parameters,
    eos_token_ids,
    load_causal_lm,
    load_tokenizer,
    make_student,
    resolve_model_source,
    shared_vocab_size,
    student_vocab_size,
)
from distill.objective import StudentObjective
from distill.rollout import (
    SOURCES,
    Completion,
    MicroBatch,
    SamplingParams,
    collate,
    draw_sources,
    generate_completions,
)
from distill.teachers import CrossTokenizerTeacher, LocalTeacher, LossSettings
from distill.teachers.cache import prompt_crc
from distill.teachers.cross_tokenizer import uld_settings
from distill.teachers.remote import build_remote_teacher, check_routes, teachers_of

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class EncodedExample:
    prompt_ids: list[int]
    prompt_truncated: bool
    completion_ids: list[int] | None


def check_output_dir(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())) and not overwrite:
        raise ValueError(
            f"output_dir {run_dir} already exists and is not empty: choose another --output_dir, continue it with "
            f"`distill train --resume {run_dir}`, or replace it with --overwrite_output_dir true"
        )


def _mixed_precision(config: DistillConfig, device_type: str) -> str:
    if config.dtype == "float32":
        return "no"
    if config.dtype == "bfloat16":
        return "bf16"
    if config.dtype == "float16":
        return "fp16"
    if device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


class Distiller:
    """Distil `teacher` into `student` as `config` says; models, tokenizer and datasets may be objects.

    Everything that can be checked without loading a model (config, datasets, output directory, model
    paths) is checked in the constructor before any model is loaded.
    """

    def __init__(
        self,
        config: DistillConfig,
        *,
        student: nn.Module | str | None = None,
        teacher: nn.Module | str | None = None,
        tokenizer: Any = None,
        teacher_tokenizer: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        resume: bool = False,
    ):
        self.config = config.validate()
        self.resuming = resume
        self.objects_given = {name: type(value).__name__ for name, value in
                              (("student", student), ("teacher", teacher), ("dataset", train_dataset), ("eval_dataset", eval_dataset))
                              if value is not None and not isinstance(value, str)}
        self.run_dir = Path(config.output_dir)

        self.train_examples = examples_from_dataset(
            load_dataset_spec(train_dataset if train_dataset is not None else config.dataset, config.dataset_split, "dataset"), "dataset"
        )
        self.eval_examples = self._load_eval_examples(train_dataset, eval_dataset)
        if config.uses_off_policy() and not config.seq_kd and config.method != "offline":
            missing = [e.index for e in self.train_examples if e.completion is None]
            if missing:
                raise ValueError(
                    f"lmbda={config.lmbda} (schedule {config.lmbda_schedule!r}) makes some micro-batches off-policy, "
                    f"but {len(missing)} dataset rows have no completion (first: row {missing[0]}). Add a 'completion' "
                    "column (or assistant turns in 'messages'), set seq_kd: true to let the teacher write them, or set lmbda: 1 "
                    "with lmbda_schedule: constant"
                )
        if not resume:
            check_output_dir(self.run_dir, config.overwrite_output_dir)
        teacher_spec = teacher if teacher is not None else config.teacher
        if config.remote_teacher() is not None:
            if teacher is not None:
                raise ValueError(f"teacher: this run's teacher is {'teacher_cache' if config.teacher_cache else 'teacher_url'}; "
                                 "do not also pass a teacher model")
            teacher_spec = None
        teacher_source = resolve_model_source(teacher_spec, "teacher") if isinstance(teacher_spec, str) else None
        student_source = None
        student_spec = student if student is not None else config.student
        if isinstance(student_spec, str):
            student_source = resolve_model_source(student_spec, "student")

        from accelerate import Accelerator

        trackers = [t.strip() for t in config.report_to.split(",") if t.strip() and t.strip() != "none"]
        for tracker in trackers:
            modules = {"tensorboard": ("tensorboard", "tensorboardX")}.get(tracker, (tracker,))
            if not any(importlib.util.find_spec(m) for m in modules):
                raise ValueError(f"report_to: {tracker} is not installed; pip install {modules[0]} (or drop it from report_to)")
        device_type = "cuda" if config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available()) else config.device
        no_accelerator = not torch.cuda.is_available() and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available())
        self.accelerator = Accelerator(
            # On a CPU-only machine accelerate forms a multi-process (gloo) group only when told cpu=True.
            cpu=config.device == "cpu" or (config.device == "auto" and no_accelerator),
            mixed_precision=_mixed_precision(config, device_type),
            log_with=trackers or None,
            project_dir=str(self.run_dir),
        )
        global_batch = config.per_device_train_batch_size * config.gradient_accumulation_steps * self.accelerator.num_processes
        if global_batch > len(self.train_examples):
            raise ValueError(
                f"per_device_train_batch_size ({config.per_device_train_batch_size}) x gradient_accumulation_steps "
                f"({config.gradient_accumulation_steps}) x processes ({self.accelerator.num_processes}) = {global_batch} "
                f"prompts per optimizer step, more than the dataset's {len(self.train_examples)}; lower the batch sizes"
            )
        if self.accelerator.distributed_type.value == "DEEPSPEED":
            raise ValueError("DeepSpeed is not supported yet: its engine steps the optimizer on every backward, which "
                             "breaks distill's step-wide loss denominator; use DDP or FSDP from your accelerate config")
        if config.device not in ("auto", "cpu") and self.accelerator.num_processes > 1:
            raise ValueError("device: with several processes accelerate places each on its own device; leave device 'auto'")
        self.device = self.accelerator.device if config.device in ("auto", "cpu") else torch.device(config.device)

        self._load_models(student, student_source, teacher_spec, teacher_source, tokenizer, teacher_tokenizer)

    # ---------------------------------------------------------------------------------------- set-up --
    def _load_eval_examples(self, train_dataset, eval_dataset) -> list[Example]:
        config = self.config
        spec = eval_dataset if eval_dataset is not None else config.eval_dataset
        if spec is None and config.dataset == BUNDLED_DATASET and train_dataset is None:
            spec = BUNDLED_DATASET
        if spec is None or not config.eval_before_after:
            return []
        examples = examples_from_dataset(load_dataset_spec(spec, config.eval_split, "eval_dataset"), "eval_dataset")
        return examples[: config.eval_max_prompts] if config.eval_max_prompts else examples

    def _load_models(self, student, student_source, teacher, teacher_source, tokenizer, teacher_tokenizer=None) -> None:
        config = self.config
        remote = config.remote_teacher()
        teacher_model = None
        if remote is not None:
            if not isinstance(student, nn.Module) and student_source is None:
                raise ValueError(f"student: with a {remote} teacher there are no teacher weights here to start a student "
                                 "from; give `student` (a model directory, .gguf file or hub id)")
            teacher_tokenizer = None
        elif isinstance(teacher, nn.Module):
            teacher_model, teacher_tokenizer = teacher, teacher_tokenizer or tokenizer
            if teacher_tokenizer is None:
                raise ValueError("tokenizer: pass the tokenizer when the teacher is given as a model object")
        else:
            teacher_model = load_causal_lm(teacher_source, torch.float32)
            teacher_tokenizer = load_tokenizer(teacher_source)
        if isinstance(student, nn.Module):
            student_model, student_tokenizer = student, tokenizer or teacher_tokenizer
            if student_tokenizer is None:
                raise ValueError("tokenizer: pass the tokenizer when the student is given as a model object")
        elif student_source is not None:
            student_model, student_tokenizer = load_causal_lm(student_source, torch.float32), load_tokenizer(student_source)
        else:
            student_model, student_tokenizer = teacher_model, teacher_tokenizer
        given = isinstance(student, nn.Module) or student_source is not None
        student_model = make_student(student_model, config.resolved_student_init(given))
        if teacher_model is None:  # the teacher's vocabulary is checked against the student's tokenizer remotely
            teacher_model, teacher_tokenizer = student_model, student_tokenizer
        if teacher_tokenizer.pad_token_id is None:
            teacher_tokenizer.pad_token = teacher_tokenizer.eos_token
        if config.method == "gold":
            self.vocab_size = student_vocab_size(student_tokenizer, student_model)
        else:
            self.vocab_size = shared_vocab_size(student_tokenizer, teacher_tokenizer, student_model, teacher_model)
        self.tokenizer = student_tokenizer
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.eos_ids = eos_token_ids(self.tokenizer, student_model)
        if not self.eos_ids:
            raise ValueError("the tokenizer has no EOS token; completions could never end")
        self.pad_id = self.tokenizer.pad_token_id

        student_model = student_model.float()
        if config.gradient_checkpointing:
            enable = getattr(student_model, "activation_checkpointing_enable", None) or student_model.gradient_checkpointing_enable
            enable()
            student_model.config.use_cache = False
        if config.use_peft:
            try:
                from peft import LoraConfig, get_peft_model
            except ImportError:
                raise ValueError("use_peft: true needs the optional extra: pip install peft") from None
            lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                              target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
            student_model = get_peft_model(student_model, lora)
        mixed = self.accelerator.mixed_precision
        teacher_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mixed, torch.float32) if self.device.type != "cpu" else torch.float32
        if remote is None and config.method == "gold":  # checks both tokenizers' byte spans before any encoding
            settings = uld_settings(config, self.tokenizer, teacher_tokenizer, self.vocab_size, len(teacher_tokenizer))
            self.teacher = CrossTokenizerTeacher(teacher_model.to(self.device, teacher_dtype), teacher_tokenizer, self.tokenizer,
                                                 self.eos_ids, config.max_prompt_length, settings, self.device)
        elif remote is None:
            self.teacher = LocalTeacher(teacher_model.to(self.device, teacher_dtype), self.vocab_size, self.eos_ids, self.pad_id, self.device)
        self.student_model = student_model
        self.encoder = PromptEncoder(self.tokenizer, config.max_prompt_length, config.max_new_tokens, self.eos_ids)
        self.encoded = [self._encode(e) for e in self.train_examples]
        if remote is not None:  # needs the encoded prompts: the temperature probe scores one
            probe = max((e.prompt_ids for e in self.encoded), key=len)
            self.teacher = build_remote_teacher(config, self.tokenizer, self.vocab_size, self.pad_id, probe)
            check_routes(self.teacher, self.train_examples + self.eval_examples)
            if remote == "offline":
                self._use_cached_completions()

    def _use_cached_completions(self) -> None:
        """Method offline trains on the completions the cache scored; their prompts must be the run's."""
        for example, encoded in zip(self.train_examples, self.encoded):
            cache = teachers_of(self.teacher)[example.teacher_id if len(teachers_of(self.teacher)) > 1 else ""].cache
            if example.index not in cache:
                raise ValueError(f"teacher_cache {cache.directory} has no entry for dataset row {example.index}: was it made "
                                 "from this dataset and split?")
            entry = cache.get(example.index)
            if entry.prompt_crc != prompt_crc(encoded.prompt_ids):
                raise ValueError(f"teacher_cache {cache.directory}: dataset row {example.index} has another prompt than the one "
                                 "the cache scored (another dataset, split, chat template or max_prompt_length?)")
            encoded.completion_ids = entry.tokens.tolist()

    def _encode(self, example: Example) -> EncodedExample:
        ids, truncated = self.encoder.prompt_ids(example.prompt)
        completion = self.encoder.completion_ids(example.completion) if example.completion is not None else None
        return EncodedExample(ids, truncated, completion)

    # ------------------------------------------------------------------------------------- schedule --
    def prompts_for_step(self, step: int) -> list[int]:
        """Indices of the step's prompts, all processes' shares in order: epochs of seeded permutations."""
        n = len(self.train_examples)
        size = self.config.per_device_train_batch_size * self.config.gradient_accumulation_steps * self.accelerator.num_processes
        indices, cached_epoch, order = [], None, None
        for position in range(step * size, (step + 1) * size):
            epoch = position // n
            if epoch != cached_epoch:
                order = torch.randperm(n, generator=torch.Generator().manual_seed(self.config.seed + 7919 * epoch)).tolist()
                cached_epoch = epoch
            indices.append(order[position % n])
        return indices

    def micro_batch_indices(self, step: int) -> list[list[int]]:
        """This process's micro-batches of prompt indices for optimizer step `step`."""
        bs, accum = self.config.per_device_train_batch_size, self.config.gradient_accumulation_steps
        share = self.prompts_for_step(step)[self.accelerator.process_index * bs * accum : (self.accelerator.process_index + 1) * bs * accum]
        return [share[i * bs : (i + 1) * bs] for i in range(accum)]

    # -------------------------------------------------------------------------------------- rollout --
    def sources_for_step(self, step: int) -> list[str]:
        config = self.config
        return draw_sources(config.effective_lmbda(step), config.seq_kd, config.seed, step, config.gradient_accumulation_steps)

    def rollout(self, step: int, timings: dict[str, float]) -> list[MicroBatch]:
        """Completions for every micro-batch of this process for optimizer step `step`."""
        config = self.config
        sources = self.sources_for_step(step)
        groups = self.micro_batch_indices(step)
        generated: dict[int, list[tuple[list[int], bool]]] = {}
        on_policy = [i for i, s in enumerate(sources) if s == "student"]
        if on_policy:
            sampling = SamplingParams(config.sampling_temperature, config.top_p, config.top_k, config.max_new_tokens)
            prompts = [self.encoded[j].prompt_ids for i in on_policy for j in groups[i]]
            start = time.perf_counter()
            outputs = iter(generate_completions(self.student_for_generation(), prompts, sampling, self.eos_ids, self.pad_id, self.device,
                                                   vocab_size=self.vocab_size))
            timings["generation_student"] = timings.get("generation_student", 0.0) + time.perf_counter() - start
            generated.update({i: [next(outputs) for _ in groups[i]] for i in on_policy})
        if "teacher" in sources:
            window = self._teacher_window(step, timings)
            generated.update({i: window[(step, i)] for i, s in enumerate(sources) if s == "teacher"})
        micro_batches = []
        for i, (source, group) in enumerate(zip(sources, groups)):
            completions = []
            for position, j in enumerate(group):
                example = self.encoded[j]
                if source == "dataset":
                    ids = list(example.completion_ids)
                    hit_max = bool(ids) and ids[-1] not in self.eos_ids
                else:
                    ids, hit_max = generated[i][position]
                completions.append(Completion(example.prompt_ids, ids, source, hit_max, example.prompt_truncated, self.train_examples[j]))
            micro_batches.append(collate(completions, source, self.pad_id))
        return micro_batches

    def _teacher_window(self, step: int, timings: dict[str, float]) -> dict[tuple[int, int], list[tuple[list[int], bool]]]:
        """Teacher (seq_kd) completions for every teacher micro-batch of the window of
        `seq_kd_generation_steps` steps holding `step`, generated in one batched call.

        The teacher is frozen, so sampling ahead changes nothing but the batch size. Sampling uses its own
        RNG seeded by (seed, window), so a run resumed in the middle of a window regenerates exactly the
        same completions, and the global RNG (student sampling) is untouched.
        """
        config = self.config
        size = config.seq_kd_generation_steps
        first = step - step % size
        cached = getattr(self, "_teacher_cache", None)
        if cached is not None and cached[0] == first:
            return cached[1]
        keys = [(s, i) for s in range(first, min(first + size, config.max_steps))
                for i, source in enumerate(self.sources_for_step(s)) if source == "teacher"]
        groups = {s: self.micro_batch_indices(s) for s in {s for s, _ in keys}}
        prompts = [self.encoded[j].prompt_ids for s, i in keys for j in groups[s][i]]
        examples = [self.train_examples[j] for s, i in keys for j in groups[s][i]]
        sampling = SamplingParams(config.teacher_sampling_temperature, config.teacher_top_p, config.teacher_top_k, config.max_new_tokens)
        start = time.perf_counter()
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(config.seed * 1_000_003 + first + 104_729 * (self.accelerator.process_index + 1))
            outputs = iter(self.teacher.generate(prompts, sampling, examples=examples))
        timings["generation_teacher"] = timings.get("generation_teacher", 0.0) + time.perf_counter() - start
        window = {(s, i): [next(outputs) for _ in groups[s][i]] for s, i in keys}
        self._teacher_cache = (first, window)
        return window

    def student_for_generation(self) -> nn.Module:
        return self.accelerator.unwrap_model(self.objective).student if hasattr(self, "objective") else self.student_model

    # ---------------------------------------------------------------------------------------- train --
    def setup(self) -> int:
        """Build optimizer and schedule, wrap the student for accelerate, prepare the run directory and
        restore a checkpoint when resuming. Returns the first step to run. Called by `train`."""
        from transformers import get_scheduler, set_seed

        config, accelerator = self.config, self.accelerator
        set_seed(config.seed)
        self.student_model.train()  # from_pretrained returns eval mode: no dropout, no activation checkpointing
        params = [p for p in self.student_model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                                      eps=config.adam_epsilon, weight_decay=config.weight_decay)
        warmup = config.warmup_steps or math.ceil(config.warmup_ratio * config.max_steps)
        # Not prepared by accelerate: its wrapper would step the schedule once per process.
        self.scheduler = get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=warmup, num_training_steps=config.max_steps)
        self.objective, self.optimizer = accelerator.prepare(StudentObjective(self.student_model, self.vocab_size), optimizer)

        start_step = 0
        if self.resuming:
            latest = ckpt.latest_checkpoint(self.run_dir)
            if latest is None:
                raise ValueError(f"resume: {self.run_dir} holds no checkpoint to resume from")
            start_step = ckpt.load_training_state(accelerator, latest, self.student_for_generation(), self.optimizer, self.scheduler)
            logger.info("resumed from %s (step %d)", latest, start_step)
        elif accelerator.is_main_process:
            if self.run_dir.exists() and config.overwrite_output_dir:
                shutil.rmtree(self.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (self.run_dir / "config.yaml").write_text(yaml.safe_dump(self.config_record(), sort_keys=False))
        self.metrics_log = MetricsLog(self.run_dir / "metrics.jsonl", accelerator.is_main_process)
        self.metrics_log.truncate_after(start_step)
        if config.report_to != "none":
            accelerator.init_trackers(config.run_name or self.run_dir.name, config=self.config_record())
        return start_step

    def train(self) -> dict[str, Any]:
        """Run the configured number of steps; returns {"train": last metrics, "eval": report metrics}."""
        config = self.config
        start_step = self.setup()
        student = self.student_for_generation()

        evaluator = self._evaluator()
        before = self._evaluate_before(evaluator, student)

        last_record: dict[str, Any] = {}
        step = start_step
        progress = self._progress(start_step)
        window, timings = self._new_window(), {}
        stop = StopRequest()
        interrupted = False
        started = time.perf_counter()
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
                    interrupted, time_up = self._agree([stop.requested, time_up])
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
            if self.accelerator.is_main_process:
                print(f"interrupted: saved {path}; continue with `distill train --resume {self.run_dir}`", file=sys.stderr)
            raise KeyboardInterrupt

        self.save_checkpoint(step)
        return self._finish(step, last_record, evaluator, before)

    def _train_step_or_checkpoint(self, step: int, window: MetricWindow, timings: dict[str, float]) -> None:
        """One step; when the teacher server fails for good, checkpoint the state before the step and stop.

        The checkpoint holds the weights, optimizer and RNG as they were when the step started, so a resumed
        run repeats the failed step exactly as an uninterrupted run would have taken it.
        """
        log_step = (step + 1) % self.config.logging_steps == 0 or step + 1 == self.config.max_steps
        rng = ckpt.rng_state()
        try:
            self.train_step(step, window, timings, log_step=log_step)
        except TeacherServerError as error:
            self.optimizer.zero_grad(set_to_none=True)
            ckpt.set_rng_state(rng)
            path = self.save_checkpoint(step)
            raise TeacherServerError(f"{error}\nThe run is checkpointed at step {step} ({path}); when the server is back, "
                                     f"continue with `distill train --resume {self.run_dir}`") from error

    def _agree(self, flags: list[bool]) -> list[bool]:
        """Each flag true if it is true on any process (one all-reduce)."""
        values = torch.tensor([float(f) for f in flags], device=self.device)
        if self.accelerator.num_processes > 1:
            values = self.accelerator.reduce(values, reduction="sum")
        return [bool(v > 0) for v in values.tolist()]

    def train_step(self, step: int, window: MetricWindow, timings: dict[str, float], log_step: bool) -> None:
        config, accelerator = self.config, self.accelerator
        micro_batches = self.rollout(step, timings)
        local_tokens = sum(mb.num_completion_tokens for mb in micro_batches)
        step_tokens = int(accelerator.reduce(torch.tensor(local_tokens, device=self.device), reduction="sum").item())
        scale = accelerator.num_processes / step_tokens if step_tokens else 0.0
        remote_signals = self._score_remotely(micro_batches, timings)
        for index, mb in enumerate(micro_batches):
            mb = mb.to(self.device)
            if remote_signals is not None:
                signal = remote_signals[index]
            else:
                start = time.perf_counter()
                signal = self.teacher.score(mb, config.temperature)
                timings["teacher"] = timings.get("teacher", 0.0) + time.perf_counter() - start
            start = time.perf_counter()
            sync = contextlib.nullcontext() if index == len(micro_batches) - 1 else accelerator.no_sync(self.objective)
            with sync, accelerator.autocast():
                settings = LossSettings(config.beta_for(mb.source), config.temperature, config.loss_chunk_size, return_stats=log_step)
                out = self.objective(mb.input_ids, mb.attention_mask, mb.completion_mask, signal, settings)
                accelerator.backward(out.loss_sum * scale)
            timings["student"] = timings.get("student", 0.0) + time.perf_counter() - start
            self._record_micro_batch(window, mb, out, log_step)
            timings["tokens_scored"] = timings.get("tokens_scored", 0.0) + mb.num_completion_tokens
        grad_norm = accelerator.clip_grad_norm_(self.objective.parameters(), config.max_grad_norm or float("inf"))
        if step_tokens:
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        window.add_mean("grad_norm", float(grad_norm), 1.0)
        window.add_mean("learning_rate", self.scheduler.get_last_lr()[0], 1.0)

    def _score_remotely(self, micro_batches: list[MicroBatch], timings: dict[str, float]) -> list | None:
        """A server or cache teacher scores the whole step up front (all requests in one concurrent round),
        and every process learns whether any failed before anyone enters a collective of the step, so a dead
        server ends every process with the error instead of leaving the others waiting in an all-reduce.
        None for a local teacher, which scores each micro-batch just before its loss."""
        if self.config.remote_teacher() is None:
            return None
        start, signals, error = time.perf_counter(), None, None
        try:
            score_many = getattr(self.teacher, "score_many", None)
            signals = (score_many(micro_batches, self.config.temperature) if score_many is not None
                       else [self.teacher.score(mb, self.config.temperature) for mb in micro_batches])
        except Exception as failure:  # any failure: the other processes must learn of it, not wait for this one
            error = failure
        timings["teacher"] = timings.get("teacher", 0.0) + time.perf_counter() - start
        failed, not_server = self._agree([error is not None, error is not None and not isinstance(error, TeacherServerError)])
        if not_server:  # a bug or bad data, not an outage: stop everywhere without a checkpoint (nothing to resume)
            raise error or RuntimeError("the teacher of another process failed (its error is in that process's log)")
        if failed:  # every process checkpoints together in _train_step_or_checkpoint
            raise error or TeacherServerError("the teacher server of another process failed (its error is in that process's log)")
        return signals

    def _record_micro_batch(self, window: MetricWindow, mb: MicroBatch, out, log_step: bool) -> None:
        tokens = int(out.num_tokens)
        loss_sum = float(out.loss_sum.detach())
        window.add_mean("loss", loss_sum, tokens)
        window.add_mean(f"loss/{mb.source}", loss_sum, tokens)
        lengths = [len(c.completion_ids) for c in mb.completions]
        for name in ("completion_length", f"completion_length/{mb.source}"):
            window.add_mean(name, sum(lengths), len(lengths))
            window.add_max(f"{name}_max", max(lengths))
        window.add_mean("clipped_ratio", sum(c.hit_max_new_tokens for c in mb.completions), len(lengths))
        window.add_sum("prompts_truncated", sum(c.prompt_truncated for c in mb.completions))
        window.add_sum(f"micro_batches/{mb.source}", 1)
        for teacher_id, (group_loss, group_tokens) in (out.groups or {}).items():
            window.add_mean(f"loss/teacher/{teacher_id}", float(group_loss), int(group_tokens))
        if log_step and out.stats is not None:
            for name in STAT_NAMES:
                window.add_mean(name, float(getattr(out.stats, name).double().sum()), tokens)

    def _new_window(self) -> MetricWindow:
        window = MetricWindow()
        means = ["loss", "completion_length", "clipped_ratio", "grad_norm", "learning_rate", *STAT_NAMES]
        means += [f"{kind}/{s}" for s in SOURCES for kind in ("loss", "completion_length")]
        means += [f"loss/teacher/{tid}" for tid in teachers_of(self.teacher) if tid]
        window.register(means, ["prompts_truncated", *[f"micro_batches/{s}" for s in SOURCES], "tokens_per_second/generation",
                                "tokens_per_second/teacher", "tokens_per_second/student"],
                        ["completion_length_max", *[f"completion_length/{s}_max" for s in SOURCES]])
        return window

    def _log(self, step: int, window: MetricWindow, timings: dict[str, float], progress) -> dict[str, Any]:
        gen_time = timings.get("generation_student", 0.0) + timings.get("generation_teacher", 0.0)
        gen_tokens = window.pairs["completion_length/student"][0] + window.pairs["completion_length/teacher"][0]
        scored = timings.get("tokens_scored", 0.0)
        if gen_time:
            window.add_sum("tokens_per_second/generation", gen_tokens / gen_time)
        if timings.get("teacher"):
            window.add_sum("tokens_per_second/teacher", scored / timings["teacher"])
        if timings.get("student"):
            window.add_sum("tokens_per_second/student", scored / timings["student"])
        reduced = window.reduce(self.device)
        record = {"step": step, "epoch": step * self._global_batch() / len(self.train_examples)}
        record.update({k: v for k, v in reduced.items() if not (k.startswith("micro_batches/") and v == 0)})
        for source in SOURCES:  # a source absent from the window has no maximum length to report
            if reduced.get(f"micro_batches/{source}", 0) == 0:
                record.pop(f"completion_length/{source}_max", None)
        record["lmbda"] = self.config.effective_lmbda(step - 1)
        self.metrics_log.write(record)
        if self.config.report_to != "none":
            self.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=step)
        if progress is not None:
            shown = {"loss": f"{record.get('loss', float('nan')):.3f}"}
            if "forward_kl" in record:  # methods without per-token diagnostics (gold) have no KL to show
                shown["kl"] = f"{record['forward_kl']:.3f}"
            progress.set_postfix(**shown, tok_s=f"{record.get('tokens_per_second/student', 0):.0f}", refresh=False)
        return record

    def _global_batch(self) -> int:
        return self.config.per_device_train_batch_size * self.config.gradient_accumulation_steps * self.accelerator.num_processes

    def _progress(self, start_step: int):
        if not (self.config.progress_bar and self.accelerator.is_main_process):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.config.max_steps, initial=start_step, desc="distill", dynamic_ncols=True)

    # ---------------------------------------------------------------------------- saving, evaluation --
    def save_student(self, directory: Path) -> None:
        """Write the student (save_pretrained) and tokenizer to `directory`; call on every process."""
        state = self.accelerator.get_state_dict(self.objective)
        state = {k.removeprefix("student."): v for k, v in state.items()}
        if self.accelerator.is_main_process:
            model = self.student_for_generation()
            model.save_pretrained(directory, state_dict=state, safe_serialization=True)
            self.tokenizer.save_pretrained(directory)

    def save_checkpoint(self, step: int) -> Path:
        """Checkpoint `step` unless this run already wrote it (an interrupt right after a periodic save)."""
        if getattr(self, "_saved_step", None) != step:
            ckpt.save_checkpoint(self.accelerator, self.run_dir, step, self.save_student, self.optimizer, self.scheduler,
                                 self.config.save_total_limit)
            self._saved_step = step
        return ckpt.checkpoint_dir(self.run_dir, step)

    def _evaluator(self) -> Evaluator | None:
        if not self.eval_examples or not self.accelerator.is_main_process:
            return None
        settings = EvalSettings(self.config.eval_max_new_tokens, self.config.eval_batch_size, self.config.eval_examples,
                                self.config.seed, self.config.loss_chunk_size)
        return Evaluator(self.teacher, self.tokenizer, self.encoder, self.eval_examples, self.vocab_size, self.eos_ids,
                         self.pad_id, self.device, settings)

    def _evaluate_before(self, evaluator: Evaluator | None, student: nn.Module) -> dict | None:
        path = self.run_dir / "eval" / "before.json"  # kept, so a resumed run reports the same "before"
        result = None
        if evaluator is not None:
            if path.exists():
                result = json.loads(path.read_text())
            else:
                result = evaluator.evaluate(student)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(result, indent=2, ensure_ascii=False))
        self.accelerator.wait_for_everyone()
        return result

    def save_final_model(self, directory: Path) -> None:
        """The final student for plain transformers: LoRA adapters are merged into a copy of the weights."""
        if not self.config.use_peft:
            self.save_student(directory)
            return
        if self.accelerator.is_main_process:
            merged = copy.deepcopy(self.student_for_generation()).merge_and_unload()
            merged.save_pretrained(directory, safe_serialization=True)
            self.tokenizer.save_pretrained(directory)
        self.accelerator.wait_for_everyone()

    def _finish(self, step: int, last_record: dict, evaluator: Evaluator | None, before: dict | None) -> dict[str, Any]:
        model_dir = self.run_dir / "model"
        self.save_final_model(model_dir)
        report = None
        if evaluator is not None:
            after = evaluator.evaluate(self.student_for_generation())
            report = build_report(evaluator, {"before": before, "after": after})
            write_report(report, self.run_dir / "eval")
        if self.accelerator.is_main_process:
            write_model_card(model_dir, self.config_record(), count_parameters(self.student_for_generation()), step, report)
            try:
                from distill.plot import plot_metrics

                plot_metrics(self.run_dir)
            except ImportError:
                logger.warning("matplotlib is not installed: no plots")
            if report is not None:
                print("\n".join(summary_lines(report)))
        self.accelerator.wait_for_everyone()
        if self.config.report_to != "none":
            self.accelerator.end_training()
        return {"train": last_record, "eval": report["metrics"] if report else None, "steps": step, "run_dir": str(self.run_dir)}

    def config_record(self) -> dict[str, Any]:
        record = self.config.to_dict()
        for name, given in self.objects_given.items():
            record[name] = f"<{given} object>"
        record["num_processes"] = self.accelerator.num_processes
        return record


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM during training: remembered, acted on at the next step boundary.

    Stopping only between steps keeps a checkpoint consistent (the optimizer state, the weights and the RNG
    all belong to the same completed step) and lets every process stop at the same step. A second Ctrl-C
    falls back to Python's default and interrupts at once.
    """

    def __init__(self) -> None:
        self.requested = False

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def resume_config(run_dir: Path, overrides: dict[str, Any] | None = None) -> DistillConfig:
    """The config a run was started with (its config.yaml), with `overrides` applied."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"resume: {run_dir} is not a run directory (no config.yaml)")
    values = yaml.safe_load(path.read_text())
    values.pop("num_processes", None)
    values.update(overrides or {})
    values["output_dir"] = str(run_dir)
    return DistillConfig.from_dict(values, where=str(path))
