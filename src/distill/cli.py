"""The `distill` command: train, doctor, recipes, eval, plot, serve-teacher, cache-teacher.

    distill train                                  the bundled default (SmolLM2-135M-Instruct teaches a smaller student)
    distill doctor [RECIPE] [--field value ...]    what a run with the same arguments would find at start; writes nothing
    distill train gold                             a bundled recipe by name (`distill recipes` lists them)
    distill train RECIPE.yaml --beta 0 --max-steps 50
    distill train --resume RUN_DIR [--break-lock]  continue from the last checkpoint
    distill recipes                                the bundled recipes, with one line each
    distill eval MODEL_OR_RUN_DIR [--teacher T] [--dataset D]
    distill plot RUN_DIR
    distill serve-teacher MODEL [--host 127.0.0.1] [--port 8000] [--max-logprobs 20]   teacher log-probs over vLLM's completions API
    distill cache-teacher --teacher MODEL --dataset D --top-k K --out DIR [--generate] [--overwrite]   offline teacher cache
Config flags are the DistillConfig field names (`--per_device_train_batch_size 4`; `--per-device-train-batch-size`
works too). `distill train --help` lists them all with their help.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from distill.config import DistillConfig
from distill.config.io import coerce, unknown_field_message
from distill.errors import StepFailure


def parse_field_flags(tokens: list[str]) -> dict[str, Any]:
    """`--name value`, `--name=value`, and bare `--flag` (true) into {field: typed value}."""
    values: dict[str, Any] = {}
    fields = set(DistillConfig.field_names())
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise ValueError(f"unexpected argument {token!r}: config fields are given as --name value")
        name, _, inline = token[2:].partition("=")
        name = name.replace("-", "_")
        if name not in fields:
            raise ValueError(unknown_field_message(DistillConfig, name, "command line"))
        if inline or "=" in token:
            raw, i = inline, i + 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            raw, i = tokens[i + 1], i + 2
        else:
            raw, i = "true", i + 1
        values[name] = coerce(DistillConfig, name, raw, "command line")
    return values


def _say(text: str) -> None:
    """A paragraph of help, wrapped to the terminal's width (100 columns at most), and a blank line."""
    import shutil

    width = max(40, min(100, shutil.get_terminal_size((100, 24)).columns))
    print(textwrap.fill(text, width, subsequent_indent="    ", break_on_hyphens=False) + "\n")


def fields_help() -> str:
    """Every config field with its default and help, grouped by the part of a run that reads it; wrapped to the
    terminal's width (94 columns at most)."""
    import shutil

    width = max(40, min(94, shutil.get_terminal_size((100, 24)).columns - 6))
    from distill.config_rules.help import field_groups, field_help

    fields = {f.name: f for f in DistillConfig.config_fields()}
    lines = ["config fields (--name value; YAML recipes use the same names), by what reads them:"]
    for title, names in field_groups():
        lines += ["", f"{title}:"]
        for name in names:
            f = fields[name]
            if f.default is not dataclasses.MISSING:
                default = f.default
            else:
                assert f.default_factory is not dataclasses.MISSING  # every config field has a default
                default = f.default_factory()
            lines.append(f"  --{name} (default: {default!r})")
            lines += ["      " + line for line in textwrap.wrap(field_help(name), width)]
    return "\n".join(lines)


def cmd_train(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        _say("usage: distill train [RECIPE.yaml | RECIPE_NAME] [--resume RUN_DIR] [--break-lock] [--field value ...]")
        _say("--break-lock: take over the run directory's lock left by a run on another host that is gone (a lock of a "
             "run gone on this host is taken over without it)")
        _say("RECIPE_NAME: a bundled recipe (`distill recipes` lists them), e.g. `distill train gold`")
        print(fields_help())
        return 0
    distiller = _distiller(argv)
    result = distiller.train()
    print(f"run directory: {result['run_dir']}")
    return 0


def _distiller(argv: list[str], doctor: bool = False, doctor_runs_tools: bool = False):
    """The Distiller `distill train ARGV` builds (a recipe, --resume RUN_DIR, --break-lock, field flags); `doctor`,
    `doctor_runs_tools`: built by `distill doctor` (`Distiller`'s keywords)."""
    recipe = None
    if argv and not argv[0].startswith("--"):
        recipe, argv = argv[0], argv[1:]
    resume = None
    if "--resume" in argv:
        at = argv.index("--resume")
        if at + 1 >= len(argv):
            raise ValueError("--resume needs a run directory")
        resume, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    break_lock = any(a in ("--break-lock", "--break_lock") for a in argv)
    argv = [a for a in argv if a not in ("--break-lock", "--break_lock")]
    overrides = parse_field_flags(argv)

    from distill.rundir.directory import check_inputs_outside, resume_config
    from distill.training.trainer import Distiller

    if resume is not None:
        if recipe is not None:
            raise ValueError("--resume continues a run with its own config; drop the recipe (flags may still override fields)")
        config = resume_config(Path(resume), overrides)
        return Distiller(config, resume=True, break_lock=break_lock, doctor=doctor, doctor_runs_tools=doctor_runs_tools)
    if recipe:
        from distill.recipes import bundled_name, missing_prerequisite, recipe_path

        path = recipe_path(recipe)
        config = DistillConfig.from_yaml(path, overrides)
        missing = missing_prerequisite(path, config.to_dict()) if bundled_name(path) else None
        if missing is not None:
            raise ValueError(missing)
        check_inputs_outside(Path(config.output_dir), {"recipe": str(path)})
    else:
        config = DistillConfig.from_dict(overrides, "command line")
    return Distiller(config, break_lock=break_lock, doctor=doctor, doctor_runs_tools=doctor_runs_tools)


def cmd_doctor(argv: list[str]) -> int:
    """`distill doctor` takes what `distill train` takes, runs everything a run does before it writes a file (the
    config's and the data's checks, the models loaded, the start-of-run checks, a few steps timed), prints every
    finding it can reach (`distill.doctor.setup_problems`), and writes nothing. Exit 0 when nothing would stop the
    run, 1 otherwise."""
    if any(a in ("-h", "--help") for a in argv):
        _say("usage: distill doctor [RECIPE.yaml | RECIPE_NAME] [--run-tools] [--field value ...]")
        _say("What `distill train` with the same arguments would find before writing anything: every start-of-run "
             "check's finding (errors stop a run; warnings stop it with --strict_checks true), what it measured and the "
             "fix. Writes nothing. The timed step calls no tool and makes no environment (a stand-in answers every "
             "call); --run-tools runs the run's tools and environment for real.")
        return 0
    from distill.doctor.report import ChecksFailed, text_report

    runs_tools = any(a in ("--run-tools", "--run_tools") for a in argv)
    argv = [a for a in argv if a not in ("--run-tools", "--run_tools")]
    try:
        distiller = _distiller(argv, doctor=True, doctor_runs_tools=runs_tools)
    except ChecksFailed as failed:
        print(text_report(failed.findings))
        return 1
    except (ValueError, StepFailure) as error:  # what stops `distill train` stops doctor: exit 1
        print(f"ERROR   before the checks: {error}")
        return 1
    print(text_report(distiller.findings))
    distiller.parts.location.close(distiller.parts.teachers)  # a teacher server's connections
    distiller.parts.rollout.close()  # tool workers the timed step started (--run-tools)
    return 0


def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="distill eval", description="Evaluate a student against a teacher on held-out prompts.")
    parser.add_argument("model", help="a student model directory, or a run directory (its model/ and config are used)")
    parser.add_argument("--teacher", help="teacher model (default: the run's teacher; required for a bare student directory). "
                        "For an sdft or sft run: its initial model, which is shown each row's privileged context")
    parser.add_argument("--teacher-url", help="a teacher server instead (scores the student's own samples; default: a "
                        "server run's teacher_url)")
    parser.add_argument("--method", help="the method whose teacher to build (default: the run's, else gkd); gold for a "
                        "teacher with another tokenizer (aligned divergence)")
    parser.add_argument("--dataset", help="prompts (default: the run's held-out set, else the bundled held-out split)")
    parser.add_argument("--split", default=None, help="dataset split (default: the run's eval_split, heldout; a file without a 'split' column has only 'train')")
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="report directory (default: MODEL/eval-cli or RUN_DIR/eval-cli)")
    args = parser.parse_args(argv)

    from distill.commands.eval import run_eval

    report, written = run_eval(args)
    from distill.evaluation.evaluator import summary_lines

    print("\n".join(summary_lines(report)))
    print(f"wrote {written[0]} and {written[1]}")
    return 0


def cmd_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="distill plot", description="PNG curves of a run's metrics.")
    parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    from distill.rundir.plot import plot_metrics

    for path in plot_metrics(args.run_dir):
        print(path)
    return 0


def cmd_serve_teacher(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="distill serve-teacher",
                                     description="Serve a teacher's prompt log-probs over vLLM's OpenAI-compatible /v1/completions.")
    parser.add_argument("model", help="teacher model: a directory, a .gguf file, a hub id, or smollm2-135m-instruct")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default loopback only; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--served-model-name", default=None, help="the `model` name clients send (default: MODEL)")
    parser.add_argument("--max-batch-tokens", type=int, default=16384, help="padded prompt tokens (rows x longest) per forward pass of batched requests")
    from distill.commands.serve_teacher import serve
    from distill.serving.limits import (
        DEFAULT_MAX_LOGPROBS,
        DEFAULT_MAX_PROMPT_TOKENS,
        DEFAULT_MAX_REQUEST_BYTES,
        ServerLimits,
    )

    parser.add_argument("--max-logprobs", type=int, default=DEFAULT_MAX_LOGPROBS,
                        help=f"most prompt_logprobs (top tokens per position) a request may ask for, like vLLM's; -1: no cap (default {DEFAULT_MAX_LOGPROBS})")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help=f"largest request body in bytes; larger ones get 413 (default {DEFAULT_MAX_REQUEST_BYTES})")
    parser.add_argument("--max-prompt-tokens", type=int, default=DEFAULT_MAX_PROMPT_TOKENS,
                        help=f"most prompt tokens per request, over all its prompts (default {DEFAULT_MAX_PROMPT_TOKENS})")
    args = parser.parse_args(argv)
    limits = ServerLimits(args.max_logprobs, args.max_request_bytes, args.max_prompt_tokens)
    serve(args.model, args.host, args.port, args.device, args.served_model_name, args.max_batch_tokens, limits)
    return 0


def cmd_cache_teacher(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="distill cache-teacher",
                                     description="Precompute a teacher's top-K log-probs (or its hidden states) of a dataset's "
                                     "completions to disk.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--teacher", help="a local teacher model (directory, .gguf, hub id, smollm2-135m-instruct)")
    source.add_argument("--teacher-url", help="a teacher server (vLLM or `distill serve-teacher`)")
    parser.add_argument("--tokenizer", help="with --teacher-url: the (shared) tokenizer, e.g. the student's directory")
    parser.add_argument("--dataset", required=True, help="dataset (same forms as the `dataset` config field)")
    parser.add_argument("--split", default="train")
    parser.add_argument("--top-k", type=int, default=None, help="K: log-probs kept per token (the top-k payload)")
    parser.add_argument("--payload", choices=("topk", "hidden"), default="topk",
                        help="topk: K log-probs, the token's and a tail per token; hidden: the teacher's final hidden states "
                        "and its lm_head (train with teacher_payload: hidden: the exact distribution at any temperature)")
    parser.add_argument("--hidden-dtype", choices=("float32", "bfloat16", "int8"), default="float32",
                        help="with --payload hidden: how the states are stored (4H, 2H or H + 4 bytes per token)")
    parser.add_argument("--out", required=True, help="cache directory (re-running resumes it)")
    parser.add_argument("--overwrite", action="store_true", help="rebuild --out from scratch: deletes only the cache's own "
                        "files (manifest.json, shard-NNNNN.safetensors, their temporary files), never other files")
    parser.add_argument("--temperature", type=float, default=None, help="loss temperature the log-probs are computed at "
                        "(default 1; not with --payload hidden)")
    parser.add_argument("--generate", action="store_true", help="the teacher writes the completions (sequence-level KD)")
    parser.add_argument("--sampling-temperature", type=float, default=1.0, help="with --generate: sampling temperature")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-prompt-length", type=int, default=256)
    parser.add_argument("--shard-size", type=int, default=256, help="examples per shard file")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--chat-template-kwargs", default=None, help="the chat template's arguments as JSON (the run's "
                        "chat_template_kwargs, e.g. '{\"enable_thinking\": false}'): the cache's prompts must be the run's")
    args = parser.parse_args(argv)
    from distill.commands.cache_teacher import CacheJob, run_cache_teacher
    from distill.config.io import mapping_value
    from distill.rendering.base import check_template_kwargs

    template_kwargs = mapping_value("--chat-template-kwargs", args.chat_template_kwargs, "distill cache-teacher")
    check_template_kwargs("--chat-template-kwargs", template_kwargs)

    job = CacheJob(args.teacher, args.teacher_url, args.tokenizer, args.dataset, args.split, args.top_k, args.out,
                   args.temperature, args.generate, args.max_new_tokens, args.max_prompt_length, args.shard_size,
                   args.batch_size, args.seed, args.sampling_temperature, args.device, not args.no_progress,
                   overwrite=args.overwrite, payload=args.payload, hidden_dtype=args.hidden_dtype,
                   chat_template_kwargs=template_kwargs)
    manifest = run_cache_teacher(job)
    kind = f"K={manifest['top_k']}" if args.payload == "topk" else f"hidden states in {args.hidden_dtype}, H={manifest['hidden_size']}"
    print(f"{args.out}: {manifest['num_examples']} examples, {manifest['tokens']} tokens, "
          f"{manifest['bytes_per_token']:.1f} bytes/token on disk ({manifest['token_bytes_per_token']:.0f} in per-token arrays; {kind})")
    return 0


def cmd_recipes(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="distill recipes",
                                     description="List the bundled recipes; run one with `distill train NAME`.")
    parser.add_argument("--path", action="store_true", help="also print each recipe's file")
    args = parser.parse_args(argv)
    from distill.recipes import RECIPES_DIR, bundled_recipes, prerequisite

    recipes = bundled_recipes()
    width = max((len(name) for name, _ in recipes), default=0)
    for name, description in recipes:
        print(f"{name:<{width}}  {description}")
        first = prerequisite(RECIPES_DIR / f"{name}.yaml")
        if first is not None:
            print(f"{'':<{width}}  first: {first.command}")
        if args.path:
            print(f"{'':<{width}}  {RECIPES_DIR / (name + '.yaml')}")
    print(f"\nrun one with `distill train NAME`; copy one from {RECIPES_DIR} to edit it")
    return 0


COMMANDS = {"train": cmd_train, "doctor": cmd_doctor, "eval": cmd_eval, "plot": cmd_plot, "serve-teacher": cmd_serve_teacher,
            "cache-teacher": cmd_cache_teacher, "recipes": cmd_recipes}


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to whatever `sys.stderr` is when a line is logged, not the stream it was made with
    (a caller that swaps or closes sys.stderr, as a test harness does, would otherwise leave it a dead stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def show_progress_notes() -> None:
    """distill's info lines (the end-of-turn token, student_init's layers, a resumed checkpoint, the decode loop)
    on stderr, from the main process of a launch only; other libraries keep their own levels."""
    logger = logging.getLogger("distill")
    if logger.handlers:
        return
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("distill: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    show_progress_notes()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"distill: unknown command {command!r}; one of {sorted(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[command](rest)
    except ValueError as error:
        print(f"distill {command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except StepFailure as error:  # a teacher server or a reward function: the run is checkpointed
        print(f"distill {command}: error: {error}", file=sys.stderr)
        return 3
