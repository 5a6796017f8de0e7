"""The bundled YAML recipes (`distill train gold`, `distill recipes`) and the bundled prompt set (data/).

A recipe is named by its file stem; its first comment line is its one-line description.
"""

from __future__ import annotations

import difflib
from pathlib import Path

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
    """The recipe's first comment line, without the `#`; '' if it does not start with one."""
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        return stripped.lstrip("#").strip() if stripped.startswith("#") else ""
    return ""


def bundled_recipes() -> list[tuple[str, str]]:
    """(name, one-line description) of every bundled recipe, by name."""
    return [(p.stem, describe(p)) for p in _bundled_files()]


__all__ = ["RECIPES_DIR", "bundled_name", "bundled_recipes", "describe", "recipe_path"]
