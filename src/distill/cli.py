"""The `distill` command: train, eval, plot.

    distill train                                  the bundled default (SmolLM2-135M-Instruct teaches a smaller student)
    distill train RECIPE.yaml --beta 0 --max-steps 50
    distill train --resume RUN_DIR                 continue from the last checkpoint
    distill eval MODEL_OR_RUN_DIR [--teacher T] [--dataset D]
    distill plot RUN_DIR
Config flags are the DistillConfig field names (`--per_device_train_batch_size 4`; `--per-device-train-batch-size`
works too). `distill train --help` lists them all with their help.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap
from pathlib import Path
from typing import Any

from distill.config import DistillConfig, coerce, unknown_field_message


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
            raise ValueError(unknown_field_message(name, "command line"))
        if inline or "=" in token:
            raw, i = inline, i + 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            raw, i = tokens[i + 1], i + 2
        else:
            raw, i = "true", i + 1
        values[name] = coerce(name, raw, "command line")
    return values


def fields_help() -> str:
    lines = ["config fields (--name value; YAML recipes use the same names):", ""]
    for f in dataclasses.fields(DistillConfig):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        lines.append(f"  --{f.name} (default: {default!r})")
        lines += ["      " + line for line in textwrap.wrap(f.metadata.get("help", ""), 94)]
    return "\n".join(lines)


def cmd_train(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print("usage: distill train [RECIPE.yaml] [--resume RUN_DIR] [--field value ...]\n")
        print(fields_help())
        return 0
    recipe = None
    if argv and not argv[0].startswith("--"):
        recipe, argv = argv[0], argv[1:]
    resume = None
    if "--resume" in argv:
        at = argv.index("--resume")
        if at + 1 >= len(argv):
            raise ValueError("--resume needs a run directory")
        resume, argv = argv[at + 1], argv[:at] + argv[at + 2 :]
    overrides = parse_field_flags(argv)

    from distill.trainer import Distiller, resume_config

    if resume is not None:
        if recipe is not None:
            raise ValueError("--resume continues a run with its own config; drop the recipe (flags may still override fields)")
        config = resume_config(Path(resume), overrides)
        distiller = Distiller(config, resume=True)
    else:
        config = DistillConfig.from_yaml(recipe, overrides) if recipe else DistillConfig.from_dict(overrides, "command line")
        distiller = Distiller(config)
    result = distiller.train()
    print(f"run directory: {result['run_dir']}")
    return 0


def cmd_eval(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="distill eval", description="Evaluate a student against a teacher on held-out prompts.")
    parser.add_argument("model", help="a student model directory, or a run directory (its model/ and config are used)")
    parser.add_argument("--teacher", help="teacher model (default: the run's teacher, else the bundled default)")
    parser.add_argument("--dataset", help="prompts (default: the run's held-out set, else the bundled held-out split)")
    parser.add_argument("--split", default=None, help="dataset split (default: heldout)")
    parser.add_argument("--max-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default=None, help="report directory (default: MODEL/eval-cli or RUN_DIR/eval-cli)")
    args = parser.parse_args(argv)

    from distill.standalone_eval import run_eval

    report, written = run_eval(args)
    from distill.evaluate import summary_lines

    print("\n".join(summary_lines(report)))
    print(f"wrote {written[0]} and {written[1]}")
    return 0


def cmd_plot(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="distill plot", description="PNG curves of a run's metrics.")
    parser.add_argument("run_dir")
    args = parser.parse_args(argv)
    from distill.plot import plot_metrics

    for path in plot_metrics(args.run_dir):
        print(path)
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "plot": cmd_plot}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
