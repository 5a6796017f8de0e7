"""The reference pages of the documentation site, generated from the code at build time so that they cannot go
stale (`docs/hooks.py` adds them to the site; `tests/test_docs.py` checks them against the code):

- `config_reference()`: every config field, grouped by the part of a run that reads it (`distill.field_help`),
  with its type, default and help (the help includes which methods read it, generated from the registry);
- `cli_reference()`: every `distill` command's `--help`, as the argument parser prints it;
- `benchmark_reference()`: the tables of `benchmarks/results/*.json`, as the benchmarks wrote them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _type_name(annotation) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def config_reference() -> str:
    from distill.config import DistillConfig
    from distill.field_help import field_groups, field_help

    fields = {f.name: f for f in dataclasses.fields(DistillConfig)}
    lines = ["# Config fields", "",
             "Every field of `DistillConfig`, generated from the code: the same names are YAML recipe keys, "
             "`distill train --name value` flags and `DistillConfig(name=value)` arguments. Grouped by the part of a "
             "run that reads it; a field set to something other than its default that the run would not read is an "
             "error (`distill.run_parts`).", ""]
    for title, names in field_groups():
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        for name in names:
            f = fields[name]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines += [f"### `{name}`", "", f"`{_type_name(f.type)}`, default `{default!r}`", "", field_help(name), ""]
    return "\n".join(lines)


def command_help(command: str) -> str:
    """What `distill COMMAND --help` prints."""
    from distill.cli import COMMANDS

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            COMMANDS[command](["--help"])
        except SystemExit:
            pass
    return out.getvalue().rstrip()


def cli_reference() -> str:
    from distill import cli

    lines = ["# Command line", "", "Generated from the argument parsers: what `distill --help` and each "
             "`distill COMMAND --help` print.", "", "```", cli.__doc__.strip(), "```", ""]
    for command in cli.COMMANDS:
        lines += [f"## `distill {command}`", "", "```", command_help(command), "```", ""]
    return "\n".join(lines)


def _scalar(value) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _tables(value, path: str, lines: list[str]) -> None:
    """A dict of dicts with scalar leaves becomes a table (one row per key); other dicts are walked."""
    if not isinstance(value, dict):
        return
    rows = {k: v for k, v in value.items() if isinstance(v, dict)}
    scalars = {k: v for k, v in value.items() if _scalar(v)}
    if scalars:
        lines += [f"**{path}**" if path else "", "", "| field | value |", "| --- | --- |"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in scalars.items()] + [""]
    columns = sorted({c for row in rows.values() for c, v in row.items() if _scalar(v)})
    if rows and columns:
        lines += [f"**{path + '.' if path else ''}{{{', '.join(list(rows)[:4])}{', ...' if len(rows) > 4 else ''}}}**", "",
                  "| | " + " | ".join(columns) + " |", "| --- " * (len(columns) + 1) + "|"]
        lines += [f"| {key} | " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for key, row in rows.items()]
        lines.append("")
    for key, row in rows.items():
        _tables({k: v for k, v in row.items() if isinstance(v, dict)}, f"{path}.{key}" if path else key, lines)


def benchmark_reference() -> str:
    lines = ["# Benchmark results", "",
             "Every `benchmarks/results/*.json`, rendered when the site is built: the numbers as the benchmark scripts "
             "wrote them (each script's docstring says what it measures and how; the guides discuss them).", ""]
    for path in sorted(RESULTS.glob("*.json")):
        lines += [f"## `{path.name}`", "", f"Written by `benchmarks/{path.stem.split('_')[0]}.py` (or a variant of it)."
                  if (ROOT / "benchmarks" / f"{path.stem.split('_')[0]}.py").exists() else "", ""]
        _tables(json.loads(path.read_text()), "", lines)
    return "\n".join(lines)


PAGES = {"reference/config.md": config_reference, "reference/cli.md": cli_reference,
         "reference/benchmarks.md": benchmark_reference}
