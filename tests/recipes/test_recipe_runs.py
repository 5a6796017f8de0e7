"""Every bundled recipe that needs no teacher server runs as shipped, one optimizer step, from a fresh working directory.

Nothing is overridden but the number of steps, the evaluation and the progress bar: the models, data sets and
batches are the recipe's. A recipe that reads what another command writes runs after that command, as its
`# first:` line says: agent after agent_teacher, chain after chain_teacher, bfcl after bfcl_teacher (which
runs the script writing BFCL's rows first), vision after vision_teacher, offline after the `distill cache-teacher`
command it names (each run as written). `server` is left out: it needs a teacher server running
(tests/teachers start one against its config). The evaluation runs on for the vision pair and for sft (a few of
their held-out prompts: the whole 265 of the vision pair would take minutes), off for the rest.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distill.cli import main
from distill.config import DistillConfig
from distill.recipes import RECIPES_DIR, bundled_recipes, prerequisite

NEEDS_A_SERVER = {"server"}
EVALUATED = {name: ["--eval_max_prompts", "4"] for name in ("vision_teacher", "vision", "sft")}


def _train(name: str) -> dict:
    flags = ["--max_steps", "1", "--progress_bar", "false"]
    flags += EVALUATED[name] if name in EVALUATED else ["--eval_before_after", "false"]
    assert main(["train", name, *flags]) == 0, f"distill train {name} failed"
    run = Path(DistillConfig.from_yaml(RECIPES_DIR / f"{name}.yaml").output_dir)
    return {"run": run, "metrics": [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]}


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_every_bundled_recipe_without_a_server_runs_one_step_as_shipped(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipes' relative run directories and caches land here
    names = [name for name, _ in bundled_recipes() if name not in NEEDS_A_SERVER]
    first = {name: prerequisite(RECIPES_DIR / f"{name}.yaml") for name in names}
    read_later = {shlex.split(needed.command)[2] for needed in first.values()
                  if needed is not None and needed.command.startswith("distill train")}
    done: set[str] = set()

    def depth(name: str) -> int:  # how many `distill train` runs come before this one
        needed = first[name]
        return 1 + depth(shlex.split(needed.command)[2]) if needed and needed.command.startswith("distill train") else 0

    for name in sorted(names, key=depth):  # the recipes another one needs run first
        needed = first[name]
        if needed is not None and needed.command.startswith("distill cache-teacher"):
            assert main(shlex.split(needed.command)[1:] + ["--no-progress"]) == 0
        elif needed is not None and needed.command.startswith("python "):  # a script that writes the recipe's data
            subprocess.run([sys.executable, *shlex.split(needed.command)[1:]], check=True, timeout=600)
        elif needed is not None:
            assert shlex.split(needed.command)[2] in done, f"{name} needs {needed.command}"
        result = _train(name)
        assert result["metrics"][-1]["step"] == 1 and (result["run"] / "model" / "config.json").is_file(), name
        evaluated = (result["run"] / "eval" / "eval.md")
        assert evaluated.is_file() == (name in EVALUATED), name
        if name == "vision":
            report = evaluated.read_text()
            assert "Answer accuracy" in report and "Forward KL" in report
        # A run's checkpoint and model are GBs (the default model and its optimizer state): gone once checked, so the
        # disk holds one run's at a time (and a run another recipe starts from).
        shutil.rmtree(result["run"] if name not in read_later else result["run"] / "checkpoints", ignore_errors=True)
        done.add(name)
    assert done == set(names)
