"""The documentation: the generated reference names every config field and every command (so it cannot go stale
silently), the README stays a front page whose links resolve, and every page is in the site's navigation.
`mkdocs build --strict` itself (broken links and anchors) runs in .ci/run, with the docs extra."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from distill.cli import COMMANDS
from distill.config import DistillConfig
from tests.skip_guard import needs_extra

ROOT = Path(__file__).resolve().parents[1]


def _docs_module(name: str):
    """A module of docs/ (not a package: mkdocs' hooks import them with docs/ on the path, and so do these tests)."""
    if str(ROOT / "docs") not in sys.path:
        sys.path.insert(0, str(ROOT / "docs"))
    return importlib.import_module(name)


def _reference_pages():
    return _docs_module("reference_pages")


WRITTEN = sorted(p for p in (ROOT / "docs").rglob("*.md"))
NUMBER_CELL = re.compile(r"^[-+~]?\d[\d,]*(\.\d+)?\s*(%|x|s|ms|MB|GB|KB|B)?(\s*(->|-|vs)\s*[-+~]?\d[\d,]*(\.\d+)?\s*(%|x|s|ms|MB|GB|KB|B)?)?$")


def _outside_fences(text: str) -> str:
    return re.sub(r"^```.*?^```$", "", text, flags=re.MULTILINE | re.DOTALL)


def test_every_written_page_renders_its_macros():
    """Each benchmark table and value resolves in its JSON file, and each method section in the registry."""
    macros = _docs_module("macros")
    for path in WRITTEN:
        rendered = macros.render(path.read_text(), str(path.relative_to(ROOT)))
        assert "{{ bench" not in rendered and "{{ method" not in rendered and "```benchmark-table" not in rendered


def test_measured_numbers_in_tables_come_from_the_benchmark_files():
    """A table row typed into a page may not hold a measured number: tables of numbers are `benchmark-table`
    blocks, rendered from benchmarks/results/*.json (the README's headline block is such a rendering, checked by
    the next test). A cell that is a number, a ratio or a range, bold or not, counts."""
    macros = _docs_module("macros")
    readme = (ROOT / "README.md").read_text()
    rendered_block = readme[readme.index(macros.HEADLINES_BEGIN) : readme.index(macros.HEADLINES_END)]
    for path in [*WRITTEN, ROOT / "README.md"]:
        text = path.read_text().replace(rendered_block, "") if path.name == "README.md" else path.read_text()
        for line in _outside_fences(text).splitlines():
            if not line.lstrip().startswith("|") or set(line.strip()) <= set("|-: "):
                continue
            cells = [c.replace("**", "").strip() for c in line.strip().strip("|").split("|")]
            typed = [c for c in cells if NUMBER_CELL.match(c)]
            assert not typed, f"{path.relative_to(ROOT)}: numbers typed into a table ({typed}): {line.strip()[:120]}"


def test_the_readme_headline_numbers_are_rendered_from_the_benchmark_files():
    macros = _docs_module("macros")
    readme = (ROOT / "README.md").read_text()
    assert readme == macros.readme_with_headlines(readme), "stale headline numbers: run python docs/macros.py --readme"
    assert "{{" not in readme


def test_a_missing_benchmark_key_is_an_error_naming_the_page():
    macros = _docs_module("macros")
    with pytest.raises(macros.MacroError, match=r"page\.md: .*no key 'nope'"):
        macros.render("{{ bench sdft.json results/nope }}", "page.md")
    with pytest.raises(macros.MacroError, match="does not exist"):
        macros.render("{{ bench missing.json a }}", "page.md")
    table = "```benchmark-table\nsource: iw_opd.json\nrows: rows\nlabel: [arm, config]\ncolumns:\n  - [steps, steps]\n  - [top-1, top1_teacher, .3f, max]\n```\n"
    rendered = macros.render(table, "page.md")
    assert "| arm | steps | top-1 |" in rendered
    data = json.loads((ROOT / "benchmarks" / "results" / "iw_opd.json").read_text())
    best = max(row["top1_teacher"] for row in data["rows"])
    assert f"**{best:.3f}**" in rendered and rendered.count("**") == 2


def test_a_ratio_and_a_provenance_render_from_the_file():
    macros = _docs_module("macros")
    data = json.loads((ROOT / "benchmarks" / "results" / "hidden.json").read_text())
    arms = data["step_time"]["arms"]
    ratio = macros.render('{{ bench hidden.json "step_time/arms/local/seconds_per_step" / '
                          '"step_time/arms/top-k cache/seconds_per_step" | .3f }}', "page.md")
    assert ratio == f"{arms['local']['seconds_per_step'] / arms['top-k cache']['seconds_per_step']:.3f}"
    recorded = {"commit": "a" * 40, "versions": {"torch": "2.13.0+cpu", "transformers": "5.25.0", "trl": None}}
    assert macros.provenance_text(recorded) == "commit `aaaaaaaaaa`, torch 2.13.0+cpu, transformers 5.25.0"
    on_cpu = {**recorded, "cpu": {"model": "AMD EPYC", "vector_isa": ["avx2"], "torch_kernels": "AVX512"}}
    assert macros.provenance_text(on_cpu).endswith("transformers 5.25.0, processor AMD EPYC (torch's AVX512 kernels)")
    assert macros.provenance_text({"commit": "b" * 40, "versions": "not recorded"}).endswith("package versions not recorded")
    other = {"commit": "c" * 40, "versions": {"torch": "2.13.0+cpu", "transformers": "5.26.0"}}
    parts = {"arms/sft": [recorded], "arms/gkd": [recorded, other], "untrained": "not recorded"}
    assert macros.parts_provenance_text(parts) == (
        "its 3 parts were measured over several runs, at commits `aaaaaaaaaa`, `cccccccccc`, with torch 2.13.0+cpu, "
        "transformers 5.25.0; or torch 2.13.0+cpu, transformers 5.26.0 (1 of them not recorded)")
    parts = {"arms/sft": [on_cpu], "arms/gkd": [on_cpu, recorded]}
    assert macros.parts_provenance_text(parts).endswith(
        "with torch 2.13.0+cpu, transformers 5.25.0, on processor AMD EPYC (torch's AVX512 kernels)")


def test_the_config_reference_has_every_field_once_with_its_default():
    page = _reference_pages().config_reference()
    headings = re.findall(r"^### `(\w+)`$", page, flags=re.MULTILINE)
    assert sorted(headings) == sorted(f.name for f in DistillConfig.config_fields())
    assert "### `vllm_kv_cache_gib`\n\n`float`, default `1.0`" in page


def test_the_cli_reference_has_every_command_with_its_flags():
    reference = _reference_pages()
    page = reference.cli_reference()
    assert re.findall(r"^## `distill ([\w-]+)`$", page, flags=re.MULTILINE) == list(COMMANDS)
    for command in COMMANDS:
        assert command in reference.command_help(command)
    assert "--teacher-url" in reference.command_help("cache-teacher")
    assert "--per_device_train_batch_size" in reference.command_help("train")  # the config fields, as flags


def test_the_methods_reference_has_every_method_and_every_recipe():
    from distill.methods import method_names

    page = _reference_pages().methods_reference()
    assert re.findall(r"^## `(\w+)`$", page, flags=re.MULTILINE) == list(method_names())
    for recipe in (ROOT / "src" / "distill" / "recipes").glob("*.yaml"):
        assert f"Recipe `distill train {recipe.stem}`" in page


def test_every_benchmark_result_has_a_section_with_a_table_its_plot_and_the_raw_json():
    page = _reference_pages().benchmark_reference()
    sections = dict(re.findall(r"^## `([\w.]+)`\n(.*?)(?=^## |\Z)", page, flags=re.MULTILINE | re.DOTALL))
    results = ROOT / "benchmarks" / "results"
    assert set(sections) == {path.name for path in results.glob("*.json")}
    for name, section in sections.items():
        assert f"](../benchmarks/results/{name})" in section and "Measured with: commit `" in section, name
        assert re.search(r"^\| .* \|$", section, flags=re.MULTILINE), f"{name}: no summary table"
    assert "![sdpo_rewards](../benchmarks/results/sdpo_rewards.png)" in sections["sdpo.json"]
    assert "sdft_frontier.png" in sections["sdft_frontier.json"] and ".png" not in sections["sdft.json"]
    for picture in results.glob("*.png"):
        assert sum(f"({'../benchmarks/results/' + picture.name})" in s for s in sections.values()) == 1, picture.name
    assert len(page) < 60_000  # a summary, not a dump of every file (the raw JSON is a click away)


def test_benchmark_cells_show_markup_as_text_and_cut_long_answers():
    pages = _reference_pages()
    answer = "<tool_call> {\"name\": \"lookup_code\"} </tool_call> a | b " + "x" * 200
    cell = pages._cell(answer)
    assert cell.startswith("&lt;tool_call&gt; {\"name\": \"lookup_code\"} &lt;/tool_call&gt; a \\| b ")
    assert "<" not in cell and len(cell) < len(answer) and cell.endswith("…")
    assert pages._cell("a\nb") == "a b" and pages._cell(0.123456) == "0.1235"


def _nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_navigation_and_every_navigation_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    nav = _nav_pages(config["nav"])
    generated = set(_reference_pages().PAGES)
    written = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert set(nav) == written | generated


def test_the_readme_is_a_front_page_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert readme.index('pip install "torch==2.13.0" -e ".[test]"') < 1500  # the two commands open it
    # a fresh clone: the repository of mkdocs.yml, then the CPU build of torch from PyTorch's index on a CPU machine
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert f"git clone {config['repo_url']} && cd distill" in readme and config["site_url"].startswith("https://")
    cpu_torch = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
    assert readme.index(f"git clone {config['repo_url']}") < readme.index(cpu_torch) < readme.index('pip install "torch==2.13.0" -e .')
    quickstart = (ROOT / "docs" / "quickstart.md").read_text()
    assert cpu_torch in quickstart and f"git clone {config['repo_url']}" in quickstart
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_the_trl_migration_table_names_real_fields_on_both_sides():
    reference = _reference_pages()
    ours = set(DistillConfig.field_names())
    for name, (module, method, rows) in reference.TRL_CONFIGS.items():
        from distill.methods import method_names

        assert method in method_names()
        for _, mapped, _ in rows:
            assert mapped is None or {n.strip() for n in mapped.split(",")} <= ours, mapped
    trl = needs_extra("trl", "trl")
    assert trl.__version__ == "1.16.0"
    for name, (module, _, rows) in reference.TRL_CONFIGS.items():
        config = getattr(importlib.import_module(module), name)
        theirs = {f.name for f in dataclasses.fields(config)}
        assert {trl_name for trl_name, _, _ in rows} <= theirs, name


def test_the_trl_defaults_file_is_what_the_installed_trl_declares():
    """The Migrating from TRL page reads TRL's defaults from docs/trl_defaults.json (the site is built without TRL):
    the file is current for the pinned TRL, and every row of the page has TRL's default."""
    needs_extra("trl", "trl")
    spec = importlib.util.spec_from_file_location("trl_defaults_script", ROOT / "scripts" / "trl_defaults.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert (ROOT / "docs" / "trl_defaults.json").read_text() == script.rendered(), "run python scripts/trl_defaults.py"
    reference = _reference_pages()
    page = reference.trl_reference()
    assert "| `beta` | `1.0` | [`beta`](config.md#beta) | `0.5` |" in page  # DistillationConfig's beta against on_policy's
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert len(rows) > 40
    assert not [row for row in rows if row.split("|")[2].strip() in ("", "—")]


def test_the_troubleshooting_page_lists_every_error_class():
    reference = _reference_pages()
    names = {error.__name__ for error in reference.error_classes()}
    assert {"StepFailure", "TeacherServerError", "RewardFunctionError", "RunLocked"} <= names
    assert "{{ errors }}" in (ROOT / "docs" / "troubleshooting.md").read_text()
    table = reference.error_reference()
    assert all(f"`{name}`" in table for name in names)


def test_the_sites_formulas_are_mathml_built_offline():
    """Every formula of the guides becomes MathML when the site is built (no script, no network): the converter reads
    each one, and a page's formulas come out as <math> elements."""
    sys.path.insert(0, str(ROOT / "docs"))
    from formulas import mathml

    page = '<p>a <span class="arithmatex">\\(\\beta \\in [0, 1]\\)</span> and</p><div class="arithmatex">\\[\\sum_t x_t\\]</div>'
    out = mathml(page, "probe")
    assert out.count("<math") == 2 and 'display="block"' in out and "arithmatex" not in out
    formulas = [m for path in (ROOT / "docs" / "guides").glob("*.md") for m in re.findall(r"\\\((.+?)\\\)", path.read_text())]
    assert len(formulas) > 20
    for tex in formulas:
        assert "<math" in mathml(f'<span class="arithmatex">\\({tex}\\)</span>', "guides")


def test_every_sample_row_of_the_dataset_formats_page_loads(tmp_path):
    """Each jsonl block of docs/datasets.md is a dataset distill reads: every row becomes an example (the images its
    rows name are drawn in a folder beside them)."""
    import datasets
    from PIL import Image

    from distill.data import examples_from_dataset

    page = (ROOT / "docs" / "datasets.md").read_text()
    samples = re.findall(r"^```jsonl\n(.*?)^```\n", page, re.MULTILINE | re.DOTALL)
    assert len(samples) >= 10
    for block in samples:
        rows = [json.loads(line) for line in block.splitlines()]
        for name in (image for row in rows for image in row.get("images", [])):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), "red").save(tmp_path / name)
        examples = examples_from_dataset(datasets.Dataset.from_list(rows), "dataset", tmp_path)
        assert len(examples) == len(rows)


def test_the_tutorials_table_of_defaults_is_the_configs():
    """docs/tutorial.md's "what the defaults assume" table gives each field's default as the bundled run has it."""
    resolved = DistillConfig().validate()
    table = (ROOT / "docs" / "tutorial.md").read_text().split("## What the defaults assume")[1]
    checked = 0
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`") or not cells[1].startswith("`"):
            continue
        names = re.findall(r"`(\w+)`", cells[0])
        values = re.findall(r"`([^`]+)`", cells[1])
        if len(names) != len(values):
            continue
        for name, value in zip(names, values):
            assert float(value) == float(getattr(resolved, name)), (name, value, getattr(resolved, name))
            checked += 1
    assert checked >= 7
