"""The architecture's figures, measured from the source: import circles, the trainer's size, positional sample tuples,
rendering calls outside the renderer package, the core's fields, mypy's baseline.

    python scripts/architecture_figures.py            # a table
    python scripts/architecture_figures.py --json F   # and the figures as JSON

Import edges are read from the source as tests/test_import_graph.py reads them; "all imports" counts imports inside
functions and under `if TYPE_CHECKING:` too, "top-level" only those a module runs when it is imported.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src"
sys.path.insert(0, str(ROOT / "tests"))

from test_import_graph import circles, import_graph  # noqa: E402


def folder_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folders.setdefault(folder_of(module), set())
        for target in targets:
            if folder_of(target) != folder_of(module):
                folders[folder_of(module)].add(folder_of(target))
    for module in graph:
        folders.setdefault(folder_of(module), set())
    return folders


def positional_tuples() -> list[str]:
    found = []
    for folder in ("training", "generation", "conversations"):
        for path in sorted((SOURCE / "distill" / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"rest\[|\*rest\b|-> list\[tuple", line):
                    found.append(f"{path.relative_to(SOURCE)}:{number}")
    return found


def long_modules(folder: str, limit: int) -> dict[str, int]:
    return {str(p.relative_to(SOURCE)): n for p in sorted((SOURCE / "distill" / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit}


def distiller_figures() -> dict:
    path = SOURCE / "distill/training/trainer.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Distiller")
    attributes = {t.attr for n in ast.walk(cls) for t in (n.targets if isinstance(n, ast.Assign) else
                  [n.target] if isinstance(n, (ast.AnnAssign, ast.AugAssign)) else [])
                  for t in ([t] if not isinstance(t, ast.Tuple) else t.elts)
                  if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    assert cls.end_lineno is not None, "a parsed class knows where it ends"
    return {"lines": cls.end_lineno - cls.lineno + 1, "attributes": len(attributes), "module_lines": len(path.read_text().splitlines())}


def finish_parameters() -> int | None:
    for path in (SOURCE / "distill").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "finish" and "rundir" in str(path):
                args = node.args
                return len(args.args) + len(args.kwonlyargs) - (1 if args.args and args.args[0].arg == "self" else 0)
    return None


def rendering_calls() -> list[str]:
    """Calls that render a prompt or a conversation outside the renderer package."""
    pattern = re.compile(r"\.apply_chat_template\(|\.prompt_ids\(|\.row_prompt\(|\.render\(|\.encode\(\w+\)|\.conversation\(")
    found = []
    for path in sorted((SOURCE / "distill").rglob("*.py")):
        if "rendering" in path.relative_to(SOURCE / "distill").parts[:1]:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith(("def ", "#")):
                found.append(f"{path.relative_to(SOURCE)}:{number}")
    return found


def core_fields() -> int:
    tree = ast.parse((SOURCE / "distill/config/__init__.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunFields")
    return sum(isinstance(n, ast.AnnAssign) for n in cls.body)


def mypy_baseline() -> int:
    text = (ROOT / "pyproject.toml").read_text()
    return len(re.findall(r"\{ module = \"distill", text))


def probes() -> int:
    """getattr/hasattr calls in the package (probing of objects, distill's own or not)."""
    return sum(len(re.findall(r"\b(?:getattr|hasattr)\(", p.read_text())) for p in (SOURCE / "distill").rglob("*.py"))


def config_imports() -> dict:
    code = ("import sys, distill.config as c; c.DistillConfig(); "
            "print(len([m for m in sys.modules if m.startswith('distill')]), 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(SOURCE)})
    count, torch = done.stdout.split()
    return {"distill_modules": int(count), "torch": torch == "True"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    every = import_graph(type_checking=True)
    top = import_graph(top_level_only=True)
    module_circles = circles(every)
    folder_circles = circles(folder_graph(top))
    figures = {
        "modules": len(every),
        "module_circle_sizes_all_imports": sorted((len(c) for c in module_circles), reverse=True),
        "folder_circles_top_level": folder_circles,
        "folders": len(folder_graph(top)),
        "config_import": config_imports(),
        "positional_tuples": positional_tuples(),
        "training_modules_over_300": long_modules("training", 300),
        "distiller": distiller_figures(),
        "finish_parameters": finish_parameters(),
        "rendering_calls_outside_renderer": rendering_calls(),
        "run_fields": core_fields(),
        "mypy_baseline_modules": mypy_baseline(),
        "getattr_hasattr_calls": probes(),
    }
    for name, value in figures.items():
        shown = len(value) if isinstance(value, list) and name not in ("module_circle_sizes_all_imports",) else value
        print(f"{name:36} {shown}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
