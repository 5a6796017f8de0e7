"""Assembling a run before its first step: the pieces `distill.training.recipe.assemble` puts together, in its order.

    check_arguments   objects passed from Python that the run would not read are errors
    load_examples     the training rows and the held-out ones
    student_source    which student to load (given, the location's default, or the teacher's weights)
    load_models       the student and the teacher model the location holds (if any), with tokenizers
    prepare_models    the student as it trains, the vocabulary, the encoded rows, the location's teachers
    check_contexts    prompt + completion budgets within every model's context
    make_sampler      which prompts each step draws
    check_prompts_per_step  refusing more prompts per step than the dataset has
    rollout_settings  the rollout's sampling settings (`distill.training.plan.RolloutSettings`)
    make_optimizer    AdamW (fused where it can) and the learning-rate schedule

Everything here runs before any step; none of it depends on where the teacher lives except through the
location object (`distill.locations`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from distill.agents.setup import offering_tools, tool_loop
from distill.data import (
    EncodedExample,
    Example,
    StepSampler,
    examples_from_dataset,
)
from distill.data_files import BUNDLED_DATASET, data_root, load_dataset_spec
from distill.doctor.setup_problems import SetupProblems
from distill.generation import SamplingParams
from distill.locations import TRAIN, TeacherLocation, Teachers
from distill.methods.async_fields import AsyncFields
from distill.methods.base import Method
from distill.models import (
    check_context,
    check_rows_match,
    describe_stop_tokens,
    make_student,
    prepare_student,
    resolve_model_source,
)
from distill.models.kinds import model_kind_of
from distill.models.vision import is_vision_language, split_processor
from distill.rendering import Renderer
from distill.teachers.build import load_model
from distill.training.image_checks import check_images
from distill.training.plan import RolloutSettings
from distill.training.rollout import StepRollout
from distill.training.rollout_parts import RolloutParts
from distill.training.teacher_assembly import Comparison, assemble_teachers, comparison
from distill.training.vision_fields import VisionFields

if TYPE_CHECKING:
    from distill.config import DistillConfig

logger = logging.getLogger(__name__)


def check_arguments(config: DistillConfig, location: TeacherLocation, teacher, teacher_tokenizer, eval_dataset) -> None:
    """Arguments this run would not read are errors, like config fields (no silent inputs)."""
    location.check_arguments(config, teacher, teacher_tokenizer)
    if eval_dataset is not None and not config.eval_before_after:
        raise ValueError("eval_dataset: evaluation is off (eval_before_after: false); drop eval_dataset or turn it on")


def load_examples(config: DistillConfig, method: Method, train_dataset, eval_dataset) -> tuple[list[Example], list[Example]]:
    """(training rows, held-out rows); the held-out ones are the bundled set's when training on it, none
    when evaluation is off."""
    train_spec = train_dataset if train_dataset is not None else config.dataset
    train = examples_from_dataset(load_dataset_spec(train_spec, config.dataset_split, "dataset"), "dataset",
                                  data_root(train_spec))
    method.check_examples(config, train, "dataset")
    spec = eval_dataset if eval_dataset is not None else config.eval_dataset
    if spec is None and config.dataset == BUNDLED_DATASET and train_dataset is None:
        spec = BUNDLED_DATASET
    if spec is None or not config.eval_before_after:
        return train, []
    held_out = examples_from_dataset(load_dataset_spec(spec, config.eval_split, "eval_dataset"), "eval_dataset",
                                     data_root(spec))
    return train, held_out[: config.eval_max_prompts] if config.eval_max_prompts else held_out


def student_source(config: DistillConfig, location: TeacherLocation, student):
    """The student to load: the one given, the config's, the location's default, or None (the teacher's weights)."""
    source = student if student is not None else config.student
    if source is None:
        source = location.default_student(config)
    if isinstance(source, str):
        resolve_model_source(source, "student")  # a missing path fails here, before anything loads
    return source


@dataclass
class LoadedModels:
    student: nn.Module
    tokenizer: Any
    teacher: nn.Module | None  # the teacher model the location holds here, on CPU
    teacher_tokenizer: Any


def load_models(location: TeacherLocation, method: Method, student, teacher, tokenizer, teacher_tokenizer) -> LoadedModels:
    """The student (`student`: a module, a spec, or None for the teacher's weights) and the location's
    teacher model (`teacher`: from `location.model_source`). A teacher module passed without its tokenizer
    is taken to share the student's, which holds only if both output layers have the same rows."""
    # A vision-language model object comes with its processor, passed as its tokenizer: attached to the model.
    if isinstance(teacher, nn.Module):
        teacher_tokenizer = split_processor(teacher_tokenizer if teacher_tokenizer is not None else tokenizer, teacher) \
            if teacher_tokenizer is not None or is_vision_language(teacher) else None
    if isinstance(student, nn.Module):
        tokenizer = split_processor(tokenizer, student)
    tokenizer_assumed = isinstance(teacher, nn.Module) and teacher_tokenizer is None
    loaded = location.load_model(teacher, None, method, teacher_tokenizer, tokenizer) if teacher is not None else None
    teacher_model, teacher_tokenizer = loaded if loaded is not None else (None, None)
    if isinstance(student, nn.Module):
        student_model, student_tokenizer = student, tokenizer or teacher_tokenizer
        if student_tokenizer is None:
            raise ValueError("tokenizer: pass the tokenizer when the student is given as a model object")
    elif isinstance(student, str):
        student_model, student_tokenizer = load_model(student, "student")
    elif teacher_model is not None:
        student_model, student_tokenizer = teacher_model, teacher_tokenizer
    else:
        raise ValueError(f"student: with a {location.name} teacher there are no teacher weights here to start a "
                         "student from; give `student` (a model directory, .gguf file or hub id)")
    if tokenizer_assumed and student_model is not teacher_model:
        check_rows_match(teacher_model, student_model)
    return LoadedModels(student_model, student_tokenizer, teacher_model, teacher_tokenizer)


@dataclass
class PreparedModels:
    student: nn.Module  # as it trains: layers dropped, LoRA, activation checkpointing
    tokenizer: Any  # the student's
    against: Comparison  # the vocabulary both models are compared over, the EOS ids, the pad id
    encoder: Renderer
    encoded: list[EncodedExample]  # the training rows (a cache's completions replace the dataset's)
    teachers: Teachers  # train: scores training steps (None for a method without a teacher signal); eval: the evaluation's


def prepare_models(config: DistillConfig, method: Method, location: TeacherLocation, runtime, models: LoadedModels, student_given: bool,
                   train_examples: list[Example], eval_examples: list[Example], problems: SetupProblems) -> PreparedModels:
    """The student as it trains, the vocabulary both models are compared over, the encoded training rows,
    and the teachers the location builds against them (`TeacherLocation.build`, purpose TRAIN). `problems`: what
    becomes of the context lengths' problem (raised, or kept by `distill doctor`)."""
    check_images(train_examples + eval_examples, method, location, models.student, models.teacher,
                 bool(method.objective(config).signals))
    student = make_student(models.student, config.resolved_student_init(student_given))
    problems.check("context_length", lambda: check_contexts(config, location, method, bool(method.objective(config).signals),
                                                            student, models.teacher, bool(eval_examples)))
    tokenizer = models.tokenizer
    against = comparison(method, tokenizer, student, models.teacher, models.teacher_tokenizer)
    eos_ids = against.eos_ids
    if not eos_ids:
        raise ValueError("the tokenizer has no EOS token; completions could never end")
    if runtime.is_main_process:
        logger.info("end of turn (appended to dataset and teacher completions): %s", describe_stop_tokens(tokenizer, eos_ids))
    lora = dict(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                target_modules=list(config.lora_target_modules)) if config.use_peft else None
    student = prepare_student(student, config.gradient_checkpointing, lora, VisionFields.of(config).train_vision_tower)
    encoder = model_kind_of(student).encoder(tokenizer, config.max_prompt_length, config.max_new_tokens, eos_ids, student,
                                             config.chat_template_kwargs)
    encoder = offering_tools(config, encoder)
    encoded = [encoder.row(e) for e in train_examples]
    teachers = assemble_teachers(
        location, TRAIN, config, method, tokenizer, against, runtime.device,
        probe_ids=max((e.prompt_ids for e in encoded), key=len),  # a server's temperature probe scores it
        temperature=config.temperature, teacher_tokenizer=models.teacher_tokenizer, student=student,
        teacher_model=models.teacher.to(runtime.device, runtime.teacher_dtype) if models.teacher is not None else None,
        evaluating=bool(eval_examples), examples=train_examples, encoded=encoded, eval_examples=eval_examples,
        autocast=runtime.accelerator.autocast)
    return PreparedModels(student, tokenizer, against, encoder, encoded, teachers)


def check_contexts(config: DistillConfig, location: TeacherLocation, method: Method, takes_signal: bool, student: nn.Module,
                   teacher: nn.Module | None, evaluating: bool) -> None:
    """Prompt + completion budget within the models' context (a server teacher checks per request), and the
    budgets of prompts the student's own weights see as a teacher (`TeacherLocation.prompt_budgets`)."""
    completion = ("max_new_tokens", config.max_new_tokens)
    if evaluating and config.eval_max_new_tokens > config.max_new_tokens:
        completion = ("eval_max_new_tokens", config.eval_max_new_tokens)
    budget = {"max_prompt_length": config.max_prompt_length, completion[0]: completion[1]}
    check_context(student, "student", budget)
    if teacher is not None:
        check_context(teacher, "teacher", budget)
    for name in sorted(location.prompt_budgets(config, method, takes_signal, evaluating)):
        check_context(student, "student (as its own teacher)", {name: getattr(config, name), completion[0]: completion[1]})


def make_sampler(config: DistillConfig, method: Method, runtime, num_examples: int) -> StepSampler:
    return StepSampler(num_examples, config.per_device_train_batch_size, config.gradient_accumulation_steps,
                       runtime.num_processes, runtime.process_index, config.seed, method.group_size(config))


def check_prompts_per_step(config: DistillConfig, sampler: StepSampler, runtime, num_examples: int) -> None:
    """A step's distinct prompts fit in the dataset (a step never repeats a prompt of its own)."""
    if sampler.prompts_per_step > num_examples:
        per_prompt = f" / num_generations ({sampler.generations})" if sampler.generations > 1 else ""
        raise ValueError(
            f"per_device_train_batch_size ({config.per_device_train_batch_size}) x gradient_accumulation_steps "
            f"({config.gradient_accumulation_steps}) x processes ({runtime.num_processes}){per_prompt} = "
            f"{sampler.prompts_per_step} prompts per optimizer step, more than the dataset's {num_examples}; lower the "
            "batch sizes")


def rollout_settings(config: DistillConfig, method: Method, teacher, encoder: Renderer) -> RolloutSettings:
    # A teacher whose weights move (a live or EMA self-teacher) samples step by step, never ahead.
    window = config.seq_kd_generation_steps if teacher is not None and teacher.frozen else 1
    c = config
    return RolloutSettings(SamplingParams(c.sampling_temperature, c.top_p, c.top_k, c.max_new_tokens, engine=c.generation_engine),
                           SamplingParams(c.teacher_sampling_temperature, c.teacher_top_p, c.teacher_top_k, c.max_new_tokens,
                                          engine=c.generation_engine),
                           window, c.max_steps, c.seed, method.records_log_probs(c), method.rollout_reuse(c),
                           method.loss_tokens_to_skip(c), lambda example: method.trains_row(config, example),
                           tool_loop(config, encoder, c.max_new_tokens, method.records_log_probs(c)),
                           method.guided_turns(c), method.depth_curriculum(c))




def make_optimizer(config: DistillConfig, params: list[nn.Parameter]):
    """(AdamW, schedule). The fused kernel makes one pass over each parameter's state (on 2 CPU cores 0.07 s
    per step for the default student instead of 0.3-0.7 s, and no 200-400 MB of temporaries;
    benchmarks/step.py)."""
    from transformers import get_scheduler

    fused = all(p.device.type in ("cpu", "cuda", "mps") and p.is_floating_point() for p in params)
    optimizer = torch.optim.AdamW(params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
                                  eps=config.adam_epsilon, weight_decay=config.weight_decay, fused=fused or None)
    warmup = config.warmup_steps or math.ceil(config.warmup_ratio * config.max_steps)
    return optimizer, get_scheduler(config.lr_scheduler_type, optimizer, num_warmup_steps=warmup,
                                    num_training_steps=config.max_steps)


def rollout_producer(config: DistillConfig, plan, sampler, examples, encoded, settings: RolloutSettings, with_student,
                     teacher, eos_ids: list[int], pad_id: int, vocab_size: int, device, process_index: int, stage):
    """The run's rollout producer: synchronous (`StepRollout`), or with `max_staleness` > 0 sampling ahead in a worker
    thread (`distill.training.async_rollout.AsyncRollout`), which pushes the weights to an engine that keeps its own."""
    own = AsyncFields.of(config)
    parts = RolloutParts.build(plan, sampler, examples, encoded, settings, with_student, teacher, eos_ids, pad_id, vocab_size,
                               device, process_index, stage, sampler.first_row if own.max_staleness else None)
    if not own.max_staleness:
        return StepRollout(parts)
    from distill.generation.registry import AUTO, get_engine
    from distill.training.async_rollout import AsyncRollout

    engine = None if config.generation_engine == AUTO else get_engine(config.generation_engine)
    return AsyncRollout(parts, own.max_staleness, engine if engine is not None and engine.keeps_weights else None,
                        own.staleness_pacing)
