"""`distill eval`: the training run's evaluation for any student directory or run directory.

The teacher is built the way training builds it (its `distill.locations` location), from the run's own config:
its method decides whether the teacher has another tokenizer (then the aligned divergence, ULD or the
run's hybrid ULD, is reported instead of same-vocabulary KLs), its location where the teacher lives.
`--teacher` / `--teacher-url` replace the run's teacher; a bare student directory needs one of them (no
default teacher is assumed), and `--method gold` for a teacher with another tokenizer.

A run of a method without an external teacher (sdft: the student taught itself; sft: no teacher) is
compared with the student's initial weights, shown each row's privileged context when it has one (on
general prompts that measures forgetting); `--teacher MODEL` names those initial weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from distill.agents.setup import offering_tools
from distill.config import DistillConfig
from distill.data import examples_from_dataset
from distill.data_files import BUNDLED_DATASET, data_root, load_dataset_spec
from distill.evaluation.evaluator import (
    Evaluator,
    build_report,
    eval_settings,
    write_report,
)
from distill.generation.registry import close_engine, configure_engine
from distill.locations import EVAL, location_of
from distill.methods import get_method
from distill.models import check_context, resolve_model_source
from distill.models.kinds import model_kind_of
from distill.teachers.build import load_model
from distill.training.runtime import check_device, eval_device
from distill.training.teacher_assembly import assemble_teachers, comparison


def run_eval(args) -> tuple[dict, tuple[Path, Path]]:
    target = Path(args.model)
    problems: list[str] = []  # every problem of the arguments at once, the first argument's first, before anything loads
    target_ok = collect(problems, lambda: check_target(target)) is not FAILED
    is_run = target_ok and (target / "config.yaml").is_file()  # check_target: a run directory has its model/
    record = yaml.safe_load((target / "config.yaml").read_text()) if is_run else {}
    model_dir = target / "model" if is_run else target
    config = collect(problems, lambda: eval_config(record, args)) if target_ok else DistillConfig()
    config = DistillConfig() if config is FAILED else config
    method = get_method(config.method)
    spec = args.dataset or config.eval_dataset or BUNDLED_DATASET
    examples = collect(problems, lambda: examples_from_dataset(load_dataset_spec(
        spec, args.split or config.eval_split, "dataset"), "dataset", data_root(spec)))
    collect(problems, lambda: check_device(args.device))
    if problems:
        raise ValueError(problems[0] if len(problems) == 1 else "\n  - ".join(["several problems:", *problems]))
    max_prompts = args.max_prompts if args.max_prompts is not None else (config.eval_max_prompts if is_run else 0)
    examples = examples[:max_prompts] if max_prompts else examples
    device = eval_device(args.device)
    student, tokenizer = load_model(str(model_dir), "model", device)
    budget = {"max_prompt_length": config.max_prompt_length, "max_new_tokens": config.eval_max_new_tokens}
    check_context(student, "student", budget)
    location = location_of(config, method)  # the same build as training's, for the evaluation (EVAL)
    source = location.model_source(config, None)
    teacher_model, teacher_tokenizer = location.load_model(source, device, method) if source is not None else (None, None)
    if teacher_model is not None:
        check_context(teacher_model, "teacher", budget)
    against = comparison(method, tokenizer, student, teacher_model, teacher_tokenizer)
    encoder = offering_tools(config, model_kind_of(student).encoder(tokenizer, config.max_prompt_length,
                                                                     config.eval_max_new_tokens, against.eos_ids, student,
                                                                     config.chat_template_kwargs))
    settings = eval_settings(config, method, encoder, args.batch_size)
    teachers = assemble_teachers(location, EVAL, config, method, tokenizer, against, device,
                                 probe_ids=encoder.prompt(examples[0]).ids, teacher_model=teacher_model,
                                 teacher_tokenizer=teacher_tokenizer)
    configure_engine(config)  # the run's engine samples the evaluation, as it did in training
    assert teachers.eval is not None  # every location that evaluates builds its evaluation teacher
    evaluator = None
    try:
        evaluator = Evaluator(teachers.eval, tokenizer, encoder, examples, against.vocab_size, against.eos_ids, against.pad_id,
                              device, settings)
        with torch.no_grad():
            report = build_report(evaluator, {"student": evaluator.evaluate(student)})
    finally:
        if evaluator is not None:
            evaluator.close()
        location.close(teachers)
        close_engine(config.generation_engine)
    return report, write_report(report, Path(args.out) if args.out else target / "eval-cli")


FAILED = object()


def collect(problems: list[str], check):
    """check()'s result, or FAILED with its ValueError's message added to `problems`."""
    try:
        return check()
    except ValueError as error:
        problems.append(str(error))
        return FAILED


def check_target(target: Path) -> None:
    """`target` is a run directory (config.yaml and model/) or a student model (a directory, a .gguf file, a
    hub id), checked without loading anything."""
    if (target / "config.yaml").is_file():
        if not (target / "model").is_dir():
            raise ValueError(f"{target} is a run directory without model/: the run has not finished; finish it with "
                             f"`distill train --resume {target}`, or evaluate one of its checkpoints' student directories")
        return
    resolve_model_source(str(target), "model")


def eval_config(record: dict, args) -> DistillConfig:
    """The run's config (its config.yaml) with the teacher the flags name, as the run's teacher location
    reads them (`TeacherLocation.eval_values`); for a bare student directory, the defaults with `--teacher` /
    `--teacher-url` / `--method`. `--max-new-tokens` replaces the run's eval_max_new_tokens."""
    values = {k: v for k, v in record.items() if k in DistillConfig.field_names()}
    if getattr(args, "method", None):
        values["method"] = args.method
    if getattr(args, "max_new_tokens", None):
        values["eval_max_new_tokens"] = args.max_new_tokens
    run_config = DistillConfig.from_dict(values, "run config")
    method = get_method(run_config.method)
    config = DistillConfig.from_dict(location_of(run_config, method).eval_values(method, values, record, args), "run config")
    location_of(config, method).check_evaluable(config)
    return config
