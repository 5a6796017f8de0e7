"""The documentation: the generated reference names every config field and every command (so it cannot go stale
silently), the README stays a front page whose links resolve, and every page is in the site's navigation.
`mkdocs build --strict` itself (broken links and anchors) runs in .ci/run, with the docs extra."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import yaml

from distill.cli import COMMANDS
from distill.config import DistillConfig
from tests.skip_guard import needs_extra

ROOT = Path(__file__).resolve().parents[1]


def _reference_pages():
    spec = importlib.util.spec_from_file_location("reference_pages", ROOT / "docs" / "reference_pages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_has_every_field_once_with_its_default():
    page = _reference_pages().config_reference()
    headings = re.findall(r"^### `(\w+)`$", page, flags=re.MULTILINE)
    assert sorted(headings) == sorted(f.name for f in dataclasses.fields(DistillConfig))
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


def test_every_benchmark_result_has_a_section():
    page = _reference_pages().benchmark_reference()
    for path in (ROOT / "benchmarks" / "results").glob("*.json"):
        assert f"## `{path.name}`" in page


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
