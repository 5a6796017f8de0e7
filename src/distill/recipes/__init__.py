"""The bundled YAML recipes (`distill train gold`, `distill recipes`) and the bundled data sets (data/).

A recipe is named by its file stem; the first sentence of its leading comment is its one-line description. A recipe that reads what
another command writes (a teacher trained by another recipe, a teacher cache, a teacher server) says so in a
comment line `# first: COMMAND` (`prerequisite`), which `distill recipes` shows and `distill train` names when
what it writes is missing.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

RECIPES_DIR = Path(__file__).resolve().parent


def _bundled_files() -> list[Path]:
    return sorted(RECIPES_DIR.glob("*.yaml"))


def recipe_path(name_or_path: str | Path) -> Path:
    """An existing file wins; otherwise the bundled recipe of that name (`gold` or `gold.yaml`).

    Raises ValueError naming the bundled recipes (and the closest one) for anything else.
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    text = str(name_or_path)
    names = [p.stem for p in _bundled_files()]
    bare = path.name == text  # `gold`, `gold.yaml`; not `recipes/gold.yaml` or `./gold.yaml`, which are paths
    stem = text.removesuffix(".yaml") if bare else path.stem
    if bare and stem in names:
        return RECIPES_DIR / f"{stem}.yaml"
    close = difflib.get_close_matches(stem, names, n=1, cutoff=0.5)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    what = "is neither a file nor a bundled recipe" if bare else "does not exist"
    raise ValueError(f"recipe {text!r} {what}{hint}; bundled recipes: {', '.join(names)} (`distill recipes` describes them)")


def bundled_name(path: str | Path) -> str | None:
    """The name of the bundled recipe at `path`, or None for any other file (a user's own)."""
    path = Path(path).resolve()
    return path.stem if path.parent == RECIPES_DIR and path.suffix == ".yaml" and path.is_file() else None


def describe(path: Path) -> str:
    """The recipe's one-line description: the first sentence of its leading comment (which may wrap over several
    comment lines), without the `#`; '' if the file does not start with a comment."""
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped and not lines:
            continue
        if not stripped.startswith("#"):
            break
        lines.append(stripped.lstrip("#").strip())
    text = " ".join(lines)
    sentence = re.match(r"(.+?[.!?])(\s|$)", text)
    return sentence.group(1) if sentence else text


FIRST = re.compile(r"^#\s*first:\s*(.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Prerequisite:
    """What a recipe needs run before it: `command`, as the recipe's `# first:` line gives it, and `product`, the path it
    writes that the recipe reads (a run's model directory, a cache directory; None for a server, which writes nothing)."""

    command: str
    product: str | None


def prerequisite(path: Path) -> Prerequisite | None:
    """The recipe's `# first: COMMAND` line, with the path that command writes; None when it needs nothing first.
    `distill train NAME` writes NAME's output_dir/model; `distill cache-teacher ... --out DIR` writes DIR;
    `python -m distill.tasks.bfcl ... --out DIR` writes DIR/bfcl.jsonl (BFCL's rows)."""
    found = FIRST.search(path.read_text(encoding="utf-8"))
    if found is None:
        return None
    command = found.group(1)
    words = shlex.split(command)
    if words[:2] == ["distill", "train"] and len(words) > 2:
        other = yaml.safe_load(recipe_path(words[2]).read_text(encoding="utf-8"))  # every bundled recipe names its output_dir
        return Prerequisite(command, f"{other['output_dir']}/model")
    if words[:2] == ["distill", "cache-teacher"] and "--out" in words:
        return Prerequisite(command, words[words.index("--out") + 1])
    if words[:3] == ["python", "-m", "distill.tasks.bfcl"] and "--out" in words:
        return Prerequisite(command, f"{words[words.index('--out') + 1]}/bfcl.jsonl")
    return Prerequisite(command, None)


def missing_prerequisite(path: Path, values: dict) -> str | None:
    """Why a run of the bundled recipe at `path` with these field `values` cannot start: the path its `# first:` command
    writes is one of the values and does not exist. None when nothing is missing (or the user pointed the field
    elsewhere)."""
    needed = prerequisite(path)
    if needed is None or needed.product is None or needed.product not in values.values() or Path(needed.product).exists():
        return None
    return f"recipe {path.stem} reads {needed.product}, which `{needed.command}` writes: run that first"


def bundled_recipes() -> list[tuple[str, str]]:
    """(name, one-line description) of every bundled recipe, by name."""
    return [(p.stem, describe(p)) for p in _bundled_files()]


__all__ = ["RECIPES_DIR", "Prerequisite", "bundled_name", "bundled_recipes", "describe", "missing_prerequisite",
           "prerequisite", "recipe_path"]
