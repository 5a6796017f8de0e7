"""The run's recipe: everything a run is made of, assembled once, top to bottom, before anything is written.

`assemble` reads as the order things happen in (the order matters: loading models and starting the runtime seed
and draw; a refactor that reorders them changes every number):

    _setup_parts          the method, its source plan, the teacher's location
    _setup_examples       the checks that need no model, the training and held-out rows, the output directory
    _setup_runtime        the method's objective, accelerate, the prompt sampler
    _setup_models         the student and the location's teacher loaded, prepared, encoded; the teachers built
    _setup_rollout        the method's stage and the rollout producer

What it makes is one `Assembly`, read by the loop (`distill.training.trainer`), the step (`distill.training.step`),
the training state (`distill.training.state`), the doctor's start-of-run checks and the evaluation; nothing reaches
into the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from distill.agents.support import check_conversation_rows
from distill.conversations.fields import ConversationFields
from distill.data import EncodedExample, Example, StepSampler
from distill.doctor.setup_problems import SetupProblems
from distill.locations import TeacherLocation, Teachers, location_of
from distill.methods import get_method
from distill.methods.base import Method, StageParts
from distill.rundir.directory import check_objects_given, check_output_dir, run_inputs
from distill.training.assembly import (
    LoadedModels,
    PreparedModels,
    check_arguments,
    check_prompts_per_step,
    load_examples,
    load_models,
    make_sampler,
    prepare_models,
    rollout_producer,
    rollout_settings,
    student_source,
)
from distill.training.image_checks import check_images_before_loading
from distill.training.plan import RolloutProducer, SourcePlan, StepStage
from distill.training.runtime import Runtime, start_runtime
from distill.training.student_access import StudentAccess

if TYPE_CHECKING:
    import torch

    from distill.config import DistillConfig
    from distill.rendering import Renderer
    from distill.teachers import Teacher


@dataclass(frozen=True)
class Given:
    """What the caller passed beside the config (`Distiller`'s keywords): model objects or specs in place of the
    config's `student` / `teacher`, their tokenizers, datasets in place of `dataset` / `eval_dataset`; `resume`:
    continue from the run directory's last checkpoint; `break_lock`: take over a lock another host left."""

    student: nn.Module | str | None = None
    teacher: nn.Module | str | None = None
    tokenizer: Any = None
    teacher_tokenizer: Any = None
    train_dataset: Any = None
    eval_dataset: Any = None
    resume: bool = False
    break_lock: bool = False

    def inputs(self) -> dict[str, Any]:
        """The inputs given, by config field (None: not given)."""
        return {"student": self.student, "teacher": self.teacher, "dataset": self.train_dataset,
                "eval_dataset": self.eval_dataset}

    def objects(self) -> dict[str, str]:
        """The inputs given as objects (not specs), by config field: their type names (config.yaml records those)."""
        return {name: type(value).__name__ for name, value in self.inputs().items()
                if value is not None and not isinstance(value, str)}


@dataclass(frozen=True)
class Assembly:
    """What assembly made: everything the run is made of, read by everything that runs after it.

    config: resolved (the method's defaults filled in); plan: the method's completion sources per micro-batch;
    location: where the teacher lives; run_dir, resuming, break_lock, objects_given: the run directory and how it is
    taken (objects_given: config field -> type name of an object passed from Python); train_examples,
    eval_examples: the rows (no held-out rows: no evaluation); objective: the method's loss; runtime: accelerate,
    device, precision; sampler: which prompts each step draws; student_model: the student as it trains (layers
    dropped, LoRA), before accelerate wraps it; student_given: the student is a model of its own (not the teacher's
    weights); tokenizer, encoder: the student's, and rows -> prompt ids; encoded: the training rows in the student's
    ids; vocab_size, eos_ids, pad_id: what the teacher is compared against (`Comparison`); teachers: train and eval;
    with_student: the student as it is now, for generation and evaluation; stage: the method's work on each rollout
    (sdpo's rewards), or None; rollout: the step rollout producer.
    """

    config: DistillConfig
    method: Method
    plan: SourcePlan
    location: TeacherLocation
    run_dir: Path
    resuming: bool
    break_lock: bool
    objects_given: dict[str, str]
    train_examples: list[Example]
    eval_examples: list[Example]
    objective: Any
    runtime: Runtime
    sampler: StepSampler
    student_model: nn.Module
    student_given: bool
    tokenizer: Any
    encoder: Renderer
    encoded: list[EncodedExample]
    vocab_size: int
    eos_ids: list[int]
    pad_id: int
    teachers: Teachers
    with_student: StudentAccess
    stage: StepStage | None
    rollout: RolloutProducer

    @property
    def teacher(self) -> Teacher | None:
        """The teacher that scores training steps (None for a method without a teacher signal)."""
        return self.teachers.train

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    @property
    def accelerator(self) -> Any:
        return self.runtime.accelerator

    def config_record(self) -> dict[str, Any]:
        """The config as config.yaml records it: objects passed from Python as "<Type object>"
        (distill.config.io.OBJECT_RECORD: --resume asks for them again), and the number of processes."""
        record = self.config.to_dict()
        for name, given in self.objects_given.items():
            record[name] = f"<{given} object>"
        record["num_processes"] = self.runtime.num_processes
        return record


@dataclass(frozen=True)
class _Parts:
    method: Method
    plan: SourcePlan
    location: TeacherLocation


@dataclass(frozen=True)
class _Rows:
    train: list[Example]
    held_out: list[Example]
    student: nn.Module | str | None  # which student to load (None: the teacher's weights)
    teacher: Any  # the location's teacher model source (`TeacherLocation.model_source`)


def assemble(config: DistillConfig, given: Given, problems: SetupProblems | None = None) -> tuple[Assembly, LoadedModels]:
    """The run's parts from a validated `config` and what the caller gave, checked as early as each can be:
    everything that needs no model (config, datasets, output directory and its lock, model paths and files) before
    any model loads. Returns the assembly and the models as loaded (the doctor's checks read the teacher model).
    `problems`: what becomes of a check's problem that nothing later builds on (`SetupProblems`; default: raised)."""
    problems = problems if problems is not None else SetupProblems(collect=False)
    parts = _setup_parts(config)
    rows = _setup_examples(config, parts, given, problems)
    objective, runtime, sampler = _setup_runtime(config, parts, rows, problems)
    models, prepared = _setup_models(config, parts, rows, runtime, given, problems)
    accelerator: Any = runtime.accelerator
    with_student = StudentAccess(prepared.student, config.fsdp, accelerator.unwrap_model)
    stage, rollout = _setup_rollout(config, parts, rows, runtime, sampler, prepared, with_student)
    against = prepared.against
    return Assembly(config, parts.method, parts.plan, parts.location, Path(config.output_dir), given.resume,
                    given.break_lock, given.objects(), rows.train, rows.held_out, objective, runtime, sampler,
                    prepared.student, rows.student is not None, prepared.tokenizer, prepared.encoder, prepared.encoded,
                    against.vocab_size, against.eos_ids, against.pad_id, prepared.teachers, with_student, stage,
                    rollout), models


def _setup_parts(config: DistillConfig) -> _Parts:
    method = get_method(config.method)
    return _Parts(method, method.sources(config), location_of(config, method))


def _setup_examples(config: DistillConfig, parts: _Parts, given: Given, problems: SetupProblems) -> _Rows:
    """Arguments, rows, output directory and model paths checked; no model loaded yet."""
    check_arguments(config, parts.location, given.teacher, given.teacher_tokenizer, given.eval_dataset)
    if given.resume:
        check_objects_given(config, {name for name, value in given.inputs().items() if value is not None})
    train, held_out = load_examples(config, parts.method, given.train_dataset, given.eval_dataset)
    sources = parts.plan.possible()
    problems.check("dataset_completions", lambda: parts.location.check_dataset(config, parts.method, sources, train))
    conversation = ConversationFields.of(config)
    problems.check("conversation_rows", lambda: check_conversation_rows(
        parts.method, sources, train, "dataset", bool(conversation.tools) or conversation.environment is not None))
    problems.check("output_dir", lambda: check_output_dir(
        Path(config.output_dir), config.overwrite_output_dir, run_inputs(config, parts.location), resuming=given.resume,
        break_lock=given.break_lock))
    teacher = parts.location.model_source(config, given.teacher)
    student = student_source(config, parts.location, given.student)  # None: the student starts from the teacher's weights
    check_images_before_loading(train + held_out, student if student is not None else teacher)
    return _Rows(train, held_out, student, teacher)


def _setup_runtime(config: DistillConfig, parts: _Parts, rows: _Rows,
                   problems: SetupProblems) -> tuple[Any, Runtime, StepSampler]:
    objective = parts.method.objective(config)
    runtime = start_runtime(config, str(Path(config.output_dir)))
    sampler = make_sampler(config, parts.method, runtime, len(rows.train))
    problems.check("prompts_per_step", lambda: check_prompts_per_step(config, sampler, runtime, len(rows.train)))
    return objective, runtime, sampler


def _setup_models(config: DistillConfig, parts: _Parts, rows: _Rows, runtime: Runtime, given: Given,
                  problems: SetupProblems) -> tuple[LoadedModels, PreparedModels]:
    """The models as loaded, and as they train: the student prepared, the rows encoded, the teachers built."""
    models = load_models(parts.location, parts.method, rows.student, rows.teacher, given.tokenizer,
                         given.teacher_tokenizer)
    # A student of its own (given, or the location's default model) keeps all its layers unless student_init says.
    return models, prepare_models(config, parts.method, parts.location, runtime, models, rows.student is not None,
                                  rows.train, rows.held_out, problems)


def _setup_rollout(config: DistillConfig, parts: _Parts, rows: _Rows, runtime: Runtime, sampler: StepSampler,
                   prepared: PreparedModels, with_student: StudentAccess) -> tuple[StepStage | None, RolloutProducer]:
    """The method's work on each rollout before any loss (sdpo's rewards), if it has one, and the producer."""
    against, teacher = prepared.against, prepared.teachers.train
    stage = parts.method.stage(config, StageParts(prepared.tokenizer, against.eos_ids, runtime, sampler.first_row,
                                                  prepared.student))
    rollout = rollout_producer(
        config, parts.plan, sampler, rows.train, prepared.encoded,
        rollout_settings(config, parts.method, teacher, prepared.encoder), with_student, teacher, against.eos_ids,
        against.pad_id, against.vocab_size, runtime.device, runtime.process_index, stage)
    return stage, rollout
