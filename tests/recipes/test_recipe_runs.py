"""Every bundled recipe that needs no teacher server runs as shipped, one optimizer step, from a fresh working directory.

Nothing is overridden but the number of steps, the evaluation and the progress bar: the models, data sets and
batches are the recipe's. A recipe that reads what another command writes runs after that command, as its
`# first:` line says: agent after agent_teacher, vision after vision_teacher, offline after the `distill
cache-teacher` command it names (run as written). `server` is left out: it needs a teacher server running
(tests/teachers start one against its config). The evaluation runs on for the vision pair and for sft (a few of
their held-out prompts: the whole 265 of the vision pair would take minutes), off for the rest.
"""

from __future__ import annotations

import json
import shlex
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
    done: set[str] = set()
    for name in sorted(names, key=lambda n: first[n] is not None):  # the recipes another one needs run first
        needed = first[name]
        if needed is not None and needed.command.startswith("distill cache-teacher"):
            assert main(shlex.split(needed.command)[1:] + ["--no-progress"]) == 0
        elif needed is not None:
            assert shlex.split(needed.command)[2] in done, f"{name} needs {needed.command}"
        result = _train(name)
        assert result["metrics"][-1]["step"] == 1 and (result["run"] / "model" / "config.json").is_file(), name
        evaluated = (result["run"] / "eval" / "eval.md")
        assert evaluated.is_file() == (name in EVALUATED), name
        done.add(name)
    assert done == set(names)
    report = (Path("runs/vision") / "eval" / "eval.md").read_text()
    assert "Answer accuracy" in report and "Forward KL" in report
