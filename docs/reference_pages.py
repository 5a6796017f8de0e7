"""The reference pages of the documentation site, generated from the code at build time so that they cannot go
stale (`docs/hooks.py` adds them to the site; `tests/test_docs.py` checks them against the code):

- `front_page()`: the README, as the home page (one text for both);
- `config_reference()`: every config field, grouped by the part of a run that reads it (`distill.config_rules.help`),
  with its type, default and help (the help includes which methods read it, generated from the registry);
- `cli_reference()`: every `distill` command's `--help`, as the argument parser prints it;
- `methods_reference()`: every registered method: what it reads and when, its defaults, metrics and recipes;
- `trl_reference()`: TRL's config fields and distill's equivalents (`TRL_CONFIGS`);
- `benchmark_reference()`: the tables of `benchmarks/results/*.json`, as the benchmarks wrote them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import io
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _type_name(annotation) -> str:
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def config_reference() -> str:
    from distill.config import DistillConfig
    from distill.config_rules.help import field_groups, field_help

    fields = {f.name: f for f in DistillConfig.config_fields()}
    lines = ["# Config fields", "",
             "Every field of `DistillConfig`, generated from the code: the same names are YAML recipe keys, "
             "`distill train --name value` flags and `DistillConfig(name=value)` arguments. Grouped by the part of a "
             "run that reads it; a field set to something other than its default that the run would not read is an "
             "error (`distill.config_rules.reads`).", ""]
    for title, names in field_groups():
        lines += [f"## {title[0].upper()}{title[1:]}", ""]
        for name in names:
            f = fields[name]
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            lines += [f"### `{name}`", "", f"`{_type_name(f.type)}`, default `{default!r}`", "", field_help(name), ""]
    return "\n".join(lines)


HELP_COLUMNS = 80  # the Command line page's help, wrapped as an 80-column terminal shows it


def command_help(command: str) -> str:
    """What `distill COMMAND --help` prints."""
    import os

    from distill.cli import COMMANDS

    out = io.StringIO()
    width = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)  # argparse wraps to the terminal's width: a fixed one for the page
    try:
        with contextlib.redirect_stdout(out):
            try:
                COMMANDS[command](["--help"])
            except SystemExit:
                pass
    finally:
        if width is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = width
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


CELL_CHARACTERS = 120  # longer texts (a model's answer) are cut in the table; the JSON file holds them whole


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):  # a list of scalars
        return ", ".join(_cell(v) for v in value)
    return table_text(value, CELL_CHARACTERS)


def table_text(value, limit: int) -> str:
    """`value` as one line of a Markdown table cell: whitespace collapsed, cut to `limit` characters, written as text
    (an answer's "<tool_call>" would otherwise be read as an HTML element and vanish)."""
    text = " ".join(str(value).split())
    text = text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
    return html.escape(text, quote=False).replace("|", "\\|")


def _leaf(value) -> bool:
    """A value shown in a cell: a scalar, or a list of scalars."""
    return _scalar(value) or (isinstance(value, list) and all(_scalar(v) for v in value))


def _columns(rows) -> list[str]:
    """The leaf keys of `rows` (dicts), in first-seen order."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update({k: None for k, v in row.items() if _leaf(v)})
    return list(seen)


def _row_table(title: str, keys: list[str], rows: list[dict], lines: list[str]) -> None:
    columns = _columns(rows)
    lines += [f"**{title}**", "", "| | " + " | ".join(columns) + " |", "| --- " * (len(columns) + 1) + "|"]
    lines += [f"| {key} | " + " | ".join(_cell(row[c]) if c in row and _leaf(row[c]) else "" for c in columns) + " |"
              for key, row in zip(keys, rows)]
    lines.append("")


def _tables(value, path: str, lines: list[str]) -> None:
    """JSON as tables: a dict's leaves (scalars, lists of scalars) as a field/value table; a dict of dicts, or a list
    of dicts, as one table with a row per entry (the rows that hold leaves); everything deeper is walked, so no list
    or nested value is left out."""
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            if _columns(value):
                _row_table(path or "rows", [str(i) for i in range(len(value))], value, lines)
            for i, item in enumerate(value):
                _tables({k: v for k, v in item.items() if not _leaf(v)}, f"{path}[{i}]", lines)
        elif not _leaf(value):
            for i, item in enumerate(value):
                _tables(item, f"{path}[{i}]", lines)
        return
    if not isinstance(value, dict):
        return
    leaves = {k: v for k, v in value.items() if _leaf(v)}
    if leaves:
        lines += [f"**{path}**" if path else "", "", "| field | value |", "| --- | --- |"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in leaves.items()] + [""]
    rows = {k: v for k, v in value.items() if isinstance(v, dict) and any(_leaf(x) for x in v.values())}
    if rows:
        names = list(rows)
        title = f"{path + '.' if path else ''}{{{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}}}"
        _row_table(title, names, list(rows.values()), lines)
    for key, child in value.items():
        if _leaf(child):
            continue
        inner = {k: v for k, v in child.items() if not _leaf(v)} if isinstance(child, dict) and key in rows else child
        _tables(inner, f"{path}.{key}" if path else key, lines)


def benchmark_reference() -> str:
    lines = ["# Benchmark results", "",
             "Every `benchmarks/results/*.json`, rendered when the site is built: the numbers as the benchmark scripts "
             "wrote them (each script's docstring says what it measures and how; the guides discuss them). Texts longer "
             f"than {CELL_CHARACTERS} characters (a model's answers) are cut here; the files hold them whole.", ""]
    for path in sorted(RESULTS.glob("*.json")):
        script = next((s for s in (path.stem, path.stem.split("_")[0]) if (ROOT / "benchmarks" / f"{s}.py").exists()), None)
        written = "" if script is None else f"Written by `benchmarks/{script}.py`" + (
            "." if script == path.stem else " (or a variant of it).")
        lines += [f"## `{path.name}`", "", written, ""]
        _tables(json.loads(path.read_text()), "", lines)
    return "\n".join(lines)


def _recipes_by_method() -> dict[str, list[Path]]:
    import yaml

    recipes = {}
    for path in sorted((ROOT / "src" / "distill" / "recipes").glob("*.yaml")):
        recipes.setdefault(yaml.safe_load(path.read_text()).get("method"), []).append(path)
    return recipes


def method_section(name: str, heading_level: int | None = 2, config_page: str = "config.md") -> str:
    """One registered method from its registry entry: summary, paper, the fields it reads (and when), its
    defaults for the fields left at None, its metrics, and the bundled recipes that use it. `config_page` is
    the Config fields page relative to the page the section lands on (the method guides include it too, without
    a heading: `heading_level=None`)."""
    from distill.methods import get_method

    method = get_method(name)
    lines = ([f"{'#' * heading_level} `{name}`", ""] if heading_level else []) + [method.summary + ".", ""]
    if method.paper is not None:
        p = method.paper
        lines += [f"Paper: {p.authors}, *{p.title}* ([arXiv {p.arxiv}](https://arxiv.org/abs/{p.arxiv})).", ""]
    teacher = {"external": "a teacher model, server or cache (`teacher`, `teacher_url`, `teacher_cache`)",
               "self": "the student itself, shown privileged context or a reprompt", "none": "none"}.get(method.teacher, method.teacher)
    lines += [f"Teacher: {teacher}{'; its own tokenizer' if method.cross_tokenizer else ''}.", ""]
    if method.reads:
        lines += ["| reads | when |", "| --- | --- |"]
        lines += [f"| {', '.join(f'[`{n}`]({config_page}#{n})' for n in part.names)} | {part.needs} |" for part in method.reads]
        lines.append("")
    if method.defaults:
        lines += ["Defaults for fields left at None: " + ", ".join(f"`{k}: {v!r}`" for k, v in method.defaults.items()) + ".", ""]
    if method.metrics:
        lines += ["Metrics (token-weighted means in `metrics.jsonl`): " + ", ".join(f"`{m}`" for m in method.metrics) + ".", ""]
    for path in _recipes_by_method().get(name, []):
        lines += [f"Recipe `distill train {path.stem}` (`{path.relative_to(ROOT)}`):", "", "```yaml",
                  path.read_text().rstrip(), "```", ""]
    return "\n".join(lines)


def methods_reference() -> str:
    from distill.methods import method_names

    lines = ["# Methods", "", "Generated from the method registry (`distill.methods`): what each method reads, its "
             "defaults and metrics, and the bundled recipes that use it. Each method's guide discusses it.", ""]
    return "\n".join(lines + [method_section(name) for name in method_names()])


def error_classes() -> list[type]:
    """Every exception class distill defines, found by importing each of its modules (a module that needs an
    optional extra that is not installed is skipped: its classes are listed where the extra is)."""
    import importlib
    import pkgutil

    import distill

    classes = {}
    for module_info in pkgutil.walk_packages(distill.__path__, "distill."):
        if module_info.name.endswith("__main__"):  # `python -m distill`: importing it runs the command line
            continue
        try:
            module = importlib.import_module(module_info.name)
        except ImportError:
            continue
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                classes[f"{value.__module__}.{value.__qualname__}"] = value
    return [classes[name] for name in sorted(classes)]


def error_reference() -> str:
    """A table of `error_classes()`: name, base, module and the first paragraph of the docstring."""
    lines = ["| error class | a kind of | raised when |", "| --- | --- | --- |"]
    for error in error_classes():
        doc = " ".join((error.__doc__ or "").strip().split("\n\n")[0].split())
        lines.append(f"| `{error.__name__}` (`{error.__module__}`) | `{error.__bases__[0].__name__}` | {doc} |")
    return "\n".join(lines) + "\n"


def check_reference() -> str:
    """A table of the start-of-run checks (`distill.doctor`): name, what it checks, the failure it comes from."""
    from distill.doctor.run import registered_checks

    lines = ["| check | what it checks | from |", "| --- | --- | --- |"]
    for check in registered_checks():
        lines.append(f"| `{check.name}` | {check.title} | {check.source} |")  # write a tag in backticks: `<think>`
    return "\n".join(lines) + "\n"


def recipe_reference() -> str:
    """A table of the bundled recipes (`distill recipes`): name, its one-line description, and the command it needs run
    first (its `# first:` line: another recipe's run, a teacher cache, a teacher server)."""
    from distill.recipes import RECIPES_DIR, bundled_recipes, prerequisite

    lines = ["| recipe | what it does | run first |", "| --- | --- | --- |"]
    for name, description in bundled_recipes():
        first = prerequisite(RECIPES_DIR / f"{name}.yaml")
        run_first = f"`{first.command}`" if first is not None else ""
        lines.append(f"| `{name}` | {description.replace('|', '/')} | {run_first} |")
    return "\n".join(lines) + "\n"


def front_page() -> str:
    """The site's home page: the README, its links into docs/ made relative to the site."""
    return (ROOT / "README.md").read_text().replace("](docs/", "](")


PAGES = {"index.md": front_page, "reference/config.md": config_reference, "reference/cli.md": cli_reference,
         "reference/methods.md": methods_reference, "reference/benchmarks.md": benchmark_reference}


# TRL 1.16.0's config fields -> distill's: (TRL field, distill field(s) or None, note). tests/test_docs.py checks
# that every distill name is a config field and, where trl is installed, that every TRL name is the config's.
TRL_CONFIGS = {
    "GKDConfig": ("trl.experimental.gkd", "gkd", [
        ("teacher_model_name_or_path", "teacher", "or `teacher_url` / `teacher_cache` for a teacher outside the process"),
        ("lmbda", "lmbda", "the same meaning; distill's default schedule differs (`lmbda_schedule`: constant, linear, "
                           "step; gkd's default is `step`: teacher samples first, then the mix)"),
        ("beta", "beta", "the same for student samples; `off_policy_beta` may differ for dataset and teacher completions"),
        ("seq_kd", "seq_kd", "the same; the teacher samples at `teacher_sampling_temperature` (default 0.8, measured: "
                             "fewer looping greedy answers than 1.0), where TRL uses `temperature`; "
                             "`seq_kd_generation_steps` samples several steps' teacher completions at once"),
        ("max_new_tokens", "max_new_tokens", ""),
        ("temperature", "sampling_temperature", "TRL 1.16.0's GKDTrainer samples with it and never passes it to the loss "
                                                "(its loss temperature is 1); distill's loss temperature is `temperature`"),
        ("disable_dropout", None, "the teacher always runs in eval mode; the student trains as its config says"),
    ]),
    "DistillationConfig": ("trl", "on_policy", [
        ("teacher_model_name_or_path", "teacher", ""),
        ("beta", "beta", ""),
        ("max_completion_length", "max_new_tokens", ""),
        ("temperature", "sampling_temperature, temperature", "one value in TRL, for sampling and the divergence; two "
                                                              "fields here"),
        ("top_p", "top_p", ""),
        ("top_k", "top_k", ""),
        ("use_vllm", "generation_engine", "`vllm` (colocated) or `vllm_server`"),
        ("vllm_mode", "generation_engine", "`colocate` -> `vllm`, `server` -> `vllm_server`"),
        ("vllm_server_base_url", "vllm_server_url", "distill pushes weights through a shared directory (docs: vLLM)"),
        ("vllm_gpu_memory_utilization", "vllm_kv_cache_gib", "a KV cache size in GiB instead of a memory fraction"),
    ]),
    "GOLDConfig": ("trl.experimental.gold", "gold", [
        ("teacher_model_name_or_path", "teacher", "its own tokenizer comes with it"),
        ("lmbda", "lmbda", ""),
        ("beta", "beta", "read with `uld_use_hybrid_loss: true`"),
        ("seq_kd", "seq_kd", ""),
        ("max_completion_length", "max_new_tokens", ""),
        ("use_uld_loss", "method", "`method: gold` is ULD"),
        ("uld_use_hybrid_loss", "uld_use_hybrid_loss", ""),
        ("uld_hybrid_matched_weight", "uld_hybrid_matched_weight", ""),
        ("uld_hybrid_unmatched_weight", "uld_hybrid_unmatched_weight", ""),
        ("uld_crossentropy_weight", "uld_crossentropy_weight", ""),
    ]),
    "IWOPDConfig": ("trl.experimental.iw_opd", "iw_opd", [
        ("teacher_model_name_or_path", "teacher", ""),
        ("teacher_model_server_url", "teacher_url", "any server speaking vLLM's prompt log-probs"),
        ("iw_opd_gamma", "iw_opd_gamma", ""),
        ("iw_opd_epsilon", "iw_opd_epsilon", ""),
        ("max_completion_length", "max_new_tokens", ""),
        ("max_prompt_length", "max_prompt_length", ""),
    ]),
    "SDFTConfig": ("trl.experimental.sdft", "sdft", [
        ("teacher_model_kind", "teacher_model_kind", ""),
        ("teacher_update_rate", "teacher_update_rate", "r is the student's share: (1 - r) teacher + r student"),
        ("teacher_sync_steps", "teacher_sync_steps", ""),
        ("teacher_prompt_template", "teacher_prompt_template", ""),
        ("distillation_mode", "distillation_mode", ""),
        ("distillation_topk", "distillation_topk", ""),
        ("distillation_is_clip", "distillation_is_clip", ""),
        ("generate_from_teacher", "generate_from_teacher", ""),
        ("num_loss_tokens_to_skip", "num_loss_tokens_to_skip", ""),
        ("num_iterations", "num_iterations", ""),
        ("max_completion_length", "max_new_tokens", ""),
        ("max_prompt_length", "max_prompt_length", ""),
    ]),
    "SDPOConfig": ("trl.experimental.sdpo", "sdpo", [
        ("num_generations", "num_generations", ""),
        ("reward_weights", "reward_weights", "reward functions: `reward_funcs` (module:function names)"),
        ("scale_rewards", "advantage_scaling", "'group', 'batch' or 'none'"),
        ("loss_type", "loss_type", ""),
        ("epsilon", "epsilon_low", ""),
        ("epsilon_high", "epsilon_high", ""),
        ("distillation_weight", "distillation_weight", "0 is GRPO"),
        ("success_reward_threshold", "success_reward_threshold", ""),
        ("dont_reprompt_on_self_success", "demonstration_from_self", "inverted: true there is false here"),
        ("include_environment_feedback", "include_feedback", "the `feedback` column"),
        ("environment_feedback_only_without_solution", "feedback_only_without_solution", ""),
        ("remove_thinking_from_demonstration", "remove_thinking_from_demonstration", ""),
        ("reprompt_template", "reprompt_template", ""),
        ("solution_template", "solution_template", ""),
        ("feedback_template", "feedback_template", ""),
        ("max_reprompt_len", "max_reprompt_length", ""),
        ("teacher_model_kind", "teacher_model_kind", ""),
        ("teacher_update_rate", "teacher_update_rate", ""),
        ("num_iterations", "num_iterations", ""),
    ]),
}


def _trl_defaults(module: str, name: str) -> dict[str, object] | None:
    """The TRL config class's field defaults, or None when TRL is not installed (the `trl` extra)."""
    import dataclasses
    import importlib
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # its experimental configs are what is migrated from
    try:
        config = getattr(importlib.import_module(module), name)
    except ImportError:
        return None
    defaults: dict[str, object] = {}
    for field in dataclasses.fields(config):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return defaults


def _shown(value: object) -> str:
    return "—" if value is None else f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def trl_reference() -> str:
    from distill.config import DistillConfig

    lines = ["# Migrating from TRL", "",
             "TRL's trainer configs and the distill fields that do the same (TRL 1.16.0; the table is checked against "
             "both libraries by `tests/test_docs.py`). Fields shared with `TrainingArguments` (`learning_rate`, "
             "`per_device_train_batch_size`, `gradient_accumulation_steps`, `max_steps`, `seed`, `logging_steps`, "
             "`save_steps`, `report_to`, ...) keep their names. A TRL field not listed has no distill equivalent.", "",
             "Behaviours that differ on purpose:", "",
             "- **The loss denominator**: the sum over the whole optimizer step's completion tokens, divided by their "
             "count over every micro-batch and process (TRL divides per micro-batch): the gradient does not depend on "
             "how a step is split ([Using it](../usage.md)). sdpo's distillation term is a mean over the step's "
             "distilled tokens.",
             "- **Metrics** are token-weighted over the step and the processes.",
             "- **Temperatures**: the loss temperature (`temperature`) and the sampling temperatures are separate fields.",
             "- **Bad input fails before a model loads**, naming the field; a field the run would not read is an error.",
             "- **Defaults differ**: each table gives both libraries' defaults (TRL's read from TRL when the `trl` extra "
             "is installed; distill's with the method's own defaults filled in). The learning rate, the lengths and "
             "gkd's `lmbda` schedule are tuned for the bundled 135M demo: set them for your models.",
             ""]
    common = [("learning_rate", "learning_rate"), ("per_device_train_batch_size", "per_device_train_batch_size"),
              ("gradient_accumulation_steps", "gradient_accumulation_steps"), ("max_steps", "max_steps")]
    for name, (module, method, rows) in TRL_CONFIGS.items():
        trl_defaults = _trl_defaults(module, name)
        ours_resolved = DistillConfig(method=method).validate()
        lines += [f"## `{name}` -> `method: {method}`", "", f"(`{module}.{name}`)", "",
                  "| TRL | TRL default | distill | distill default | note |", "| --- | --- | --- | --- | --- |"]
        for trl_name, ours, note in [*rows, *((t, o, "") for t, o in common if t not in {r[0] for r in rows})]:
            names = [n.strip() for n in ours.split(",")] if ours else []
            mapped = ", ".join(f"[`{n}`](config.md#{n})" for n in names) if names else "—"
            theirs = "—" if trl_defaults is None or trl_name not in trl_defaults else _shown(trl_defaults[trl_name])
            own = ", ".join(_shown(getattr(ours_resolved, n)) for n in names if hasattr(ours_resolved, n)) or "—"
            lines.append(f"| `{trl_name}` | {theirs} | {mapped} | {own} | {note} |")
        lines.append("")
    return "\n".join(lines)


PAGES["reference/trl.md"] = trl_reference
