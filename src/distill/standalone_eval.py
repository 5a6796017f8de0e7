"""`distill eval`: the training run's evaluation for any student directory or run directory.

The teacher is built the way training builds it (`distill.teachers.build`), from the run's own config:
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

from distill import placement
from distill.config import DistillConfig
from distill.data import PromptEncoder, examples_from_dataset
from distill.data_files import BUNDLED_DATASET, load_dataset_spec
from distill.evaluate import EvalSettings, Evaluator, build_report, write_report
from distill.methods import get_method
from distill.models import (
    DEFAULT_TEACHER,
    check_context,
    eos_token_ids,
    make_student,
    resolve_model_source,
    student_vocab_size,
)
from distill.run import OBJECT_RECORD
from distill.runtime import check_device, eval_device
from distill.teacher_prompts import TeacherPrompts
from distill.teachers.build import (
    close_teacher,
    comparison_vocab_size,
    load_model,
    model_teacher,
    server_settings,
    server_teacher,
)
from distill.teachers.self_teacher import SelfTeacher


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
    examples = collect(problems, lambda: examples_from_dataset(load_dataset_spec(
        args.dataset or config.eval_dataset or BUNDLED_DATASET, args.split or config.eval_split, "dataset"), "dataset"))
    collect(problems, lambda: check_device(args.device))
    if problems:
        raise ValueError(problems[0] if len(problems) == 1 else "\n  - ".join(["several problems:", *problems]))
    max_prompts = args.max_prompts if args.max_prompts is not None else (config.eval_max_prompts if is_run else 0)
    examples = examples[:max_prompts] if max_prompts else examples
    device = eval_device(args.device)
    student, tokenizer = load_model(str(model_dir), "model", device)
    settings = EvalSettings(args.max_new_tokens or config.eval_max_new_tokens, args.batch_size or config.eval_batch_size,
                            config.eval_examples, config.seed, config.loss_chunk_size, config.generation_engine)
    budget = {"max_prompt_length": config.max_prompt_length, "max_new_tokens": settings.max_new_tokens}
    check_context(student, "student", budget)
    eos_ids = eos_token_ids(tokenizer, student)
    encoder = PromptEncoder(tokenizer, config.max_prompt_length, settings.max_new_tokens, eos_ids)
    if method.teacher != "external":
        vocab = student_vocab_size(tokenizer, student)
        teacher = initial_model_teacher(config, tokenizer, vocab, eos_ids, device, settings.max_new_tokens)
    elif placement.teacher_location(config) == placement.SERVER:  # scores the student's own samples; it does not sample
        vocab = student_vocab_size(tokenizer, student)
        server = server_settings(config, placement.parse_routes(config.teacher_url, "teacher_url")[""])
        probe = encoder.prompt_ids(examples[0].prompt)[0]
        teacher = server_teacher(server, tokenizer, vocab, 1.0, probe)
    else:
        teacher_model, teacher_tokenizer = load_model(config.teacher, "teacher", device)
        check_context(teacher_model, "teacher", budget)
        vocab = comparison_vocab_size(method.cross_tokenizer, tokenizer, teacher_tokenizer, student, teacher_model)
        teacher = model_teacher(teacher_model, teacher_tokenizer, tokenizer, cross_tokenizer=method.cross_tokenizer,
                                vocab_size=vocab, student_eos_ids=eos_ids, device=device,
                                max_prompt_length=config.max_prompt_length, uld_config=config)
    try:
        evaluator = Evaluator(teacher, tokenizer, encoder, examples, vocab, eos_ids, tokenizer.pad_token_id, device, settings)
        with torch.no_grad():
            report = build_report(evaluator, {"student": evaluator.evaluate(student)})
    finally:
        close_teacher(teacher)
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


def initial_model_teacher(config: DistillConfig, tokenizer, vocab: int, eos_ids: list[int], device: torch.device,
                          max_new_tokens: int) -> SelfTeacher:
    """The evaluation's teacher for a run without an external one: its initial model, shown privileged context."""
    initial, _ = load_model(config.student or DEFAULT_TEACHER, "teacher (the run's initial model)", device)
    initial = make_student(initial, config.resolved_student_init(True))
    check_context(initial, "teacher (the run's initial model)", {"max_teacher_prompt_length": config.max_teacher_prompt_length,
                                                                  "max_new_tokens": max_new_tokens})
    prompts = TeacherPrompts(PromptEncoder(tokenizer, config.max_teacher_prompt_length, max_new_tokens, eos_ids),
                             config.teacher_prompt_template)
    # "live" on a model that never trains is its initial weights, without the copy "base" would make.
    return SelfTeacher("live", initial.eval(), prompts, vocab, eos_ids, tokenizer.pad_token_id, device)


def eval_config(record: dict, args) -> DistillConfig:
    """The run's config (its config.yaml) with the teacher the flags name; for a bare student directory, the
    defaults with `--teacher` / `--teacher-url` / `--method`."""
    values = {k: v for k, v in record.items() if k in DistillConfig.field_names()}
    if getattr(args, "method", None):
        values["method"] = args.method
    if get_method(values.get("method", DistillConfig.method)).teacher != "external":
        return _initial_model_config(values, record, args)
    teacher_url = getattr(args, "teacher_url", None)
    if args.teacher or teacher_url:
        values.update(teacher=args.teacher or DistillConfig.teacher, teacher_url=teacher_url, teacher_cache=None)
    elif not record:
        raise ValueError("a student directory without a run's config.yaml: name the teacher with --teacher MODEL or "
                         "--teacher-url URL")
    elif str(values.get("teacher", "")).startswith("<") or values.get("teacher_cache"):
        raise ValueError("this run's teacher was a Python object or a cache, which cannot be loaded or score new samples "
                         "here: pass --teacher MODEL (a local copy of the teacher) or --teacher-url URL")
    elif values.get("teacher_url") and list(placement.parse_routes(values["teacher_url"], "teacher_url")) != [""]:
        raise ValueError("this run had several teacher servers: pass the one to score with as --teacher-url URL (or "
                         "--teacher MODEL)")
    return DistillConfig.from_dict(values, "run config")


def _initial_model_config(values: dict, record: dict, args) -> DistillConfig:
    """A self-distillation or sft run: `--teacher` names its initial model (the run's `student`)."""
    method = values["method"] if "method" in values else DistillConfig.method
    if getattr(args, "teacher_url", None):
        raise ValueError(f"--teacher-url: a {method} run is compared with its own initial model (shown the rows' privileged "
                         "context), not a server; pass that model as --teacher MODEL, or nothing to use the run's")
    if args.teacher:
        values["student"] = args.teacher
    elif not record:
        raise ValueError(f"a student directory without a run's config.yaml: name the {method} run's initial model with "
                         "--teacher MODEL")
    elif isinstance(values.get("student"), str) and OBJECT_RECORD.fullmatch(values["student"]):
        raise ValueError("this run's student was a Python object, which cannot be loaded here: pass its initial weights "
                         "as --teacher MODEL")
    return DistillConfig.from_dict(values, "run config")
