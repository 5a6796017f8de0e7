"""The reference pages of the documentation site, generated from the code at build time so that they cannot go
stale (`docs/hooks.py` adds them to the site; `tests/test_docs.py` checks them against the code):

- `front_page()`: the README, as the home page (one text for both);
- `config_reference()`: every config field, grouped by the part of a run that reads it (`distill.config_rules.help`),
  with its type, default and help (the help includes which methods read it, generated from the registry);
- `cli_reference()`: every `distill` command's `--help`, as the argument parser prints it;
- `methods_reference()`: every registered method: what it reads and when, its defaults, metrics and recipes;
- `trl_reference()`: TRL's config fields and distill's equivalents (`TRL_CONFIGS`);
- `benchmark_reference()`: one section per `benchmarks/results/*.json`: what it measures, what it was measured with,
  a summary table (the first one a written page renders from it), its plot and a link to the raw JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import io
import json
import re
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


CELL_CHARACTERS = 120  # longer texts (a model's answer) are cut in a table; the JSON file holds them whole


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


def _scalar(value) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _nav_pages() -> list[str]:
    """The written pages in the site's navigation order."""
    import yaml

    def walk(entries) -> list[str]:
        found = []
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            found += walk(value) if isinstance(value, list) else [value]
        return found

    return [page for page in walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]) if (ROOT / "docs" / page).is_file()]


def curated_tables() -> dict[str, list[tuple[str, dict]]]:
    """{result file: [(page, benchmark-table spec)]}: the tables the written pages render from each file, in the site's
    navigation order (the page that discusses a result chose its columns)."""
    import yaml
    from macros import TABLE_BLOCK

    found: dict[str, list[tuple[str, dict]]] = {}
    for page in _nav_pages():
        for block in TABLE_BLOCK.findall((ROOT / "docs" / page).read_text()):
            spec = yaml.safe_load(block)
            found.setdefault(spec["source"], []).append((page, spec))
    return found


def _writing_script(result: Path) -> Path | None:
    """The benchmark script that writes `result`: the script of its name, else the one whose docstring names the file
    (`recipe_<name>.json` names recipe_default.json), else the script its name starts with."""
    import ast
    import re

    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    exact = ROOT / "benchmarks" / f"{result.stem}.py"
    if exact.is_file():
        return exact
    for script in scripts:
        doc = ast.get_docstring(ast.parse(script.read_text())) or ""
        for named in re.findall(r"benchmarks/results/([\w<>]+)\.json", doc):
            if re.fullmatch(re.sub(r"<\w+>", r"\\w+", named), result.stem):
                return script
    prefix = ROOT / "benchmarks" / f"{result.stem.split('_')[0]}.py"
    return prefix if prefix.is_file() else None


def _plots(result: Path) -> list[Path]:
    """The PNG files of a result: named like it, or starting with its name and `_` where no longer result name does
    (sdpo_rewards.png is sdpo.json's; sdft_frontier.png is sdft_frontier.json's, not sdft.json's)."""
    stems = [p.stem for p in RESULTS.glob("*.json")]

    def owner(picture: Path) -> str | None:
        matches = [s for s in stems if picture.stem == s or picture.stem.startswith(s + "_")]
        return max(matches, key=len) if matches else None

    return [picture for picture in sorted(RESULTS.glob("*.png")) if owner(picture) == result.stem]


PROVENANCE = ("provenance", "provenance_of_parts")


def _overview(data: dict) -> list[str]:
    """A field/value table of a result without a curated table: its top-level values, and those one level down."""
    rows = [(k, v) for k, v in data.items() if _scalar(v) and k != "provenance"]
    rows += [(f"{k} / {k2}", v2) for k, v in data.items() if isinstance(v, dict) and k not in PROVENANCE
             for k2, v2 in v.items() if _scalar(v2)]
    return ["| field | value |", "| --- | --- |", *[f"| {k} | {_cell(v)} |" for k, v in rows], ""]


def benchmark_reference() -> str:
    """One section per result file: what it measures, what it was measured with, its summary table (the first table a
    written page renders from it), its plot, and a link to the raw JSON."""
    from macros import parts_provenance_text, provenance_text, render_table

    tables = curated_tables()
    lines = ["# Benchmark results", "",
             "Every file of `benchmarks/results/`, one section each: what the benchmark measures (from its script's "
             "docstring), what it was measured with (the commit, package versions and processor the file records), a "
             "summary table, its plot where it has one, and the raw JSON. The pages that discuss a result say what it "
             "shows and does not.", ""]
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        script = _writing_script(path)
        lines += [f"## `{path.name}`", ""]
        if script is not None:
            import ast

            doc = (ast.get_docstring(ast.parse(script.read_text())) or "").split("\n\n")[0]
            lines += [f"{' '.join(doc.split())} Written by `benchmarks/{script.name}`.", ""]
        pages = [page for page in _nav_pages() if re.search(rf"(bench|source:) {re.escape(path.name)}\b",
                                                            (ROOT / "docs" / page).read_text())]
        provenance = provenance_text(data["provenance"]) if "provenance" in data else "not recorded"
        if data.get("provenance_of_parts"):
            provenance += f" (its last write); {parts_provenance_text(data['provenance_of_parts'])}"
        lines += [f"Measured with: {provenance}. Raw data: [`{path.name}`](../benchmarks/results/{path.name})"
                  + ("; discussed on " + ", ".join(f"[{_page_title(page)}](../{page})" for page in pages) if pages else "")
                  + ".", ""]
        if path.name in tables:
            page, spec = tables[path.name][0]
            lines += [render_table(spec, f"reference/benchmarks.md ({page}'s table)"), ""]
        else:
            lines += _overview(data)
        lines += [f"![{picture.stem}](../benchmarks/results/{picture.name})" for picture in _plots(path)] + [""]
    return "\n".join(lines)


def _page_title(page: str) -> str:
    """A written page's first heading."""
    for line in (ROOT / "docs" / page).read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip().replace("`", "")
    return page


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


def repo_url() -> str:
    """The repository's address, as mkdocs.yml's `repo_url` gives it."""
    import yaml

    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())["repo_url"].rstrip("/")


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
    """The site's home page: the README, its links into docs/ made relative to the site and its links to other files
    of the repository (CHANGELOG.md) made links to them in the repository."""
    readme = (ROOT / "README.md").read_text().replace("](docs/", "](")
    return re.sub(r"\]\((?!https?://|#)([^)#]+\.(?:md|py|sh|toml|yml|yaml|json))\)",
                  lambda m: f"]({repo_url()}/blob/main/{m.group(1)})" if (ROOT / m.group(1)).is_file() and
                  not (ROOT / "docs" / m.group(1)).is_file() else m.group(0), readme)


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


TRL_DEFAULTS = Path(__file__).parent / "trl_defaults.json"  # written by scripts/trl_defaults.py from TRL itself


def _trl_defaults(name: str) -> dict[str, object]:
    """The TRL config class's field defaults, from docs/trl_defaults.json (the site is built without TRL)."""
    return json.loads(TRL_DEFAULTS.read_text())["configs"][name]["defaults"]


def _shown(value: object) -> str:
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


# TrainingArguments fields every TRL config has, listed in each table: (TRL field, distill field).
COMMON_FIELDS = [("learning_rate", "learning_rate"), ("per_device_train_batch_size", "per_device_train_batch_size"),
                 ("gradient_accumulation_steps", "gradient_accumulation_steps"), ("max_steps", "max_steps")]


def trl_reference() -> str:
    from distill.config import DistillConfig

    version = json.loads(TRL_DEFAULTS.read_text())["trl"]
    lines = ["# Migrating from TRL", "",
             f"TRL's trainer configs and the distill fields that do the same (TRL {version}; the table is checked against "
             "both libraries by `tests/test_docs.py`). Fields shared with `TrainingArguments` (`learning_rate`, "
             "`per_device_train_batch_size`, `gradient_accumulation_steps`, `max_steps`, `seed`, `logging_steps`, "
             "`save_steps`, `report_to`, ...) keep their names. A TRL field not listed has no distill equivalent.", "",
             "How the two compare:", "",
             "- **The loss denominator**: the sum over the whole optimizer step's completion tokens, divided by their "
             "count over every micro-batch and process, so the gradient does not depend on how a step is split "
             f"([Using it](../usage.md)). TRL {version}'s `DistillationTrainer` does the same: it counts the completion "
             "tokens it generated for the step over every process. Its `GKDTrainer` divides by the label tokens that "
             "transformers' `Trainer` counts in the step's dataset batches before on-policy or `seq_kd` sampling "
             "replaces their completions, so a sampled micro-batch is divided by the length of completions it does not "
             "train on. sdpo's distillation term is a mean over the step's distilled tokens.",
             "- **Metrics** are token-weighted over the step and the processes.",
             "- **Temperatures**: the loss temperature (`temperature`) and the sampling temperatures are separate fields.",
             "- **Bad input fails before a model loads**, naming the field; a field the run would not read is an error.",
             f"- **Defaults differ**: each table gives both libraries' defaults (TRL {version}'s as its config classes "
             "declare them, recorded in `docs/trl_defaults.json` by `scripts/trl_defaults.py`; distill's with the "
             "method's own defaults filled in). The learning rate, the lengths and gkd's `lmbda` schedule are tuned for "
             "the bundled 135M demo: set them for your models.",
             ""]
    for name, (module, method, rows) in TRL_CONFIGS.items():
        trl_defaults = _trl_defaults(name)
        ours_resolved = DistillConfig(method=method).validate()
        lines += [f"## `{name}` -> `method: {method}`", "", f"(`{module}.{name}`)", "",
                  "| TRL | TRL default | distill | distill default | note |", "| --- | --- | --- | --- | --- |"]
        for trl_name, ours, note in [*rows, *((t, o, "") for t, o in COMMON_FIELDS if t not in {r[0] for r in rows})]:
            names = [n.strip() for n in ours.split(",")] if ours else []
            mapped = ", ".join(f"[`{n}`](config.md#{n})" for n in names) if names else "—"
            theirs = _shown(trl_defaults[trl_name]) if trl_name in trl_defaults else "—"
            own = ", ".join(_shown(getattr(ours_resolved, n)) for n in names if hasattr(ours_resolved, n)) or "—"
            lines.append(f"| `{trl_name}` | {theirs} | {mapped} | {own} | {note} |")
        lines.append("")
    return "\n".join(lines)


PAGES["reference/trl.md"] = trl_reference
