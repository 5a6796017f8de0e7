"""The tests mirror the code: each folder under tests/ is named for the package or module of src/distill it tests."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
SOURCE = TESTS.parent / "src" / "distill"
# Folders that test no single package: vllm (its own CI job and environment), helpers (shared by the folders), hostile
# (bad inputs to every surface: datasets, flags, run directories, servers and caches, one suite).
NOT_MIRRORS = {"vllm", "helpers", "hostile"}


def test_every_test_folder_names_a_package_or_module_of_distill():
    folders = [p.parent.relative_to(TESTS) for p in TESTS.rglob("__init__.py") if p.parent != TESTS]
    stray = [str(folder) for folder in folders if folder.parts[0] not in NOT_MIRRORS
             and not ((SOURCE / folder).is_dir() or (SOURCE / folder).with_suffix(".py").is_file())]
    assert folders and not stray, f"test folders that name no package or module of src/distill: {stray}"


def test_every_test_file_is_in_a_package():
    # Tests are imported as packages (tests.x.y): a folder without __init__.py would import its files by basename.
    loose = [str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py") if not (p.parent / "__init__.py").is_file()]
    assert not loose, loose
