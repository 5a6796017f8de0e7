"""`distill eval`: the training run's evaluation for any student directory or run directory.

A teacher with another tokenizer than the student's (a gold run, or any such pair) is scored by the aligned
divergence (ULD, or the run's hybrid ULD) on byte-aligned token groups instead of same-vocabulary KLs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from distill.config import BUNDLED_DATASET, DEFAULT_TEACHER, DistillConfig, parse_routes
from distill.data import PromptEncoder, examples_from_dataset, load_dataset_spec
from distill.evaluate import EvalSettings, Evaluator, build_report, write_report
from distill.models import (
    eos_token_ids,
    load_causal_lm,
    load_tokenizer,
    resolve_model_source,
    shared_vocab_size,
    student_vocab_size,
)
from distill.teachers import LocalTeacher
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher, uld_settings
from distill.teachers.server import ServerSettings, ServerTeacher


def run_eval(args) -> tuple[dict, tuple[Path, Path]]:
    target = Path(args.model)
    run_config = {}
    if (target / "config.yaml").is_file() and (target / "model").is_dir():
        run_config = yaml.safe_load((target / "config.yaml").read_text())
        model_dir, out_default = target / "model", target / "eval-cli"
    else:
        model_dir, out_default = target, target / "eval-cli"
    teacher_url = getattr(args, "teacher_url", None)
    if not args.teacher and not teacher_url and (run_config.get("teacher_url") or run_config.get("teacher_cache")):
        routes = parse_routes(run_config["teacher_url"], "teacher_url") if run_config.get("teacher_url") else {}
        if list(routes) != [""]:
            raise ValueError("this run's teacher was a cache or several servers, which cannot score new samples: pass "
                             "--teacher MODEL (a local copy of the teacher) or --teacher-url URL")
        teacher_url = routes[""]
    teacher_spec = args.teacher or run_config.get("teacher") or DEFAULT_TEACHER
    dataset_spec = args.dataset or run_config.get("eval_dataset") or BUNDLED_DATASET
    split = args.split or run_config.get("eval_split") or "heldout"

    examples = examples_from_dataset(load_dataset_spec(dataset_spec, split, "dataset"), "dataset")
    max_prompts = args.max_prompts if args.max_prompts is not None else run_config.get("eval_max_prompts", 0)
    examples = examples[:max_prompts] if max_prompts else examples
    student_source = resolve_model_source(str(model_dir), "model")
    teacher_source = None if teacher_url else resolve_model_source(teacher_spec, "teacher")

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    student = load_causal_lm(student_source).to(device).eval()
    tokenizer = load_tokenizer(student_source)
    settings = EvalSettings(
        max_new_tokens=args.max_new_tokens or run_config.get("eval_max_new_tokens", 48),
        batch_size=args.batch_size or run_config.get("eval_batch_size", 8),
        num_examples=run_config.get("eval_examples", 3),
        seed=run_config.get("seed", 42),
    )
    if teacher_url:  # a server scores (KLs over its top-K + tail on the student's own samples); it does not sample
        vocab = student_vocab_size(tokenizer, student)
        eos_ids = eos_token_ids(tokenizer, student)
        teacher = ServerTeacher(ServerSettings(teacher_url, run_config.get("teacher_logprobs", 20), run_config.get("teacher_model_name")), vocab)
        teacher.check(tokenizer)
        encoder = PromptEncoder(tokenizer, run_config.get("max_prompt_length", 256), settings.max_new_tokens, eos_ids)
        evaluator = Evaluator(teacher, tokenizer, encoder, examples, vocab, eos_ids, tokenizer.pad_token_id, device, settings)
        report = build_report(evaluator, {"student": evaluator.evaluate(student)})
        return report, write_report(report, Path(args.out) if args.out else out_default)
    teacher_model = load_causal_lm(teacher_source).to(device)
    teacher_tokenizer = load_tokenizer(teacher_source)
    # A teacher with another tokenizer is evaluated like a gold run: the aligned divergence, not a KL.
    cross = run_config.get("method") == "gold" or tokenizer.get_vocab() != teacher_tokenizer.get_vocab()
    if cross:
        vocab = student_vocab_size(tokenizer, student)
    else:
        vocab = shared_vocab_size(tokenizer, teacher_tokenizer, student, teacher_model)
    eos_ids = eos_token_ids(tokenizer, student)
    encoder = PromptEncoder(tokenizer, run_config.get("max_prompt_length", 256), settings.max_new_tokens, eos_ids)
    if cross:
        defaults = {f.name: f.default for f in dataclasses.fields(DistillConfig) if f.name.startswith("uld_")}
        uld = SimpleNamespace(**{name: run_config.get(name, default) for name, default in defaults.items()})
        divergence = uld_settings(uld, tokenizer, teacher_tokenizer, vocab, len(teacher_tokenizer))
        teacher = CrossTokenizerTeacher(teacher_model, teacher_tokenizer, tokenizer, eos_ids, encoder.max_prompt_length, divergence, device)
    else:
        teacher = LocalTeacher(teacher_model, vocab, eos_ids, tokenizer.pad_token_id, device)
    evaluator = Evaluator(teacher, tokenizer, encoder, examples, vocab, eos_ids,
                          tokenizer.pad_token_id, device, settings)
    report = build_report(evaluator, {"student": evaluator.evaluate(student)})
    return report, write_report(report, Path(args.out) if args.out else out_default)
