"""The import graph of `distill` has no circle, lazy imports (inside functions) and type-only ones included.

Edges are read from the source (every `import` / `from ... import` statement anywhere in a module, except under
`if TYPE_CHECKING:`, which never runs), not from what Python happens to execute, so a circle hidden behind a
function-level import fails here too. `from pkg import
name` is an edge to `pkg.name` when that is a module, to `pkg` otherwise; the implicit import of a package's
`__init__` before any of its submodules is not an edge (every submodule import makes it, and it is not a
dependency of the importer on the package's contents).

The folders (the first name under `distill`: a package or a top-level module) are layered, as the design's
layout says, with the imports a module runs when imported (none inside a function or under `if TYPE_CHECKING:`):
no circle among them, and no folder importing one of a higher layer (`LAYERS`).
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src"


def modules() -> dict[str, Path]:
    found = {}
    for path in (SOURCE / "distill").rglob("*.py"):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_statements(tree: ast.AST, type_checking: bool = False, top_level_only: bool = False):
    """Every import statement of `tree`, at any depth, outside `if TYPE_CHECKING:` blocks (inside them too with
    `type_checking`); with `top_level_only`, only those run when the module is imported (none inside a function)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if _is_type_checking(child) and not type_checking:
                pending.extend(child.orelse)  # the else branch runs
            else:
                pending.append(child)


def import_graph(type_checking: bool = False, top_level_only: bool = False) -> dict[str, set[str]]:
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in import_statements(ast.parse(path.read_text()), type_checking, top_level_only):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
                targets = submodules if len(submodules) == len(node.names) else [base, *submodules]
            for target in targets:
                resolved = resolve(target) if target.startswith("distill") else None
                if resolved is not None and resolved != name:
                    graph[name].add(resolved)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_reader_sees_lazy_imports_and_finds_a_planted_circle():
    graph = import_graph()
    assert "distill.generation.complete" in graph["distill.generation"]  # a function-level import is an edge
    assert "distill.config.values" in graph["distill.config"]
    assert "distill.methods.base" not in graph["distill.features"]  # imported under TYPE_CHECKING only
    planted = {name: set(edges) for name, edges in graph.items()}
    planted["distill.config.values"].add("distill.config")
    assert any({"distill.config", "distill.config.values"} <= set(c) for c in circles(planted))


def test_no_import_circle_remains():
    found = circles(import_graph())
    assert not found, "import circles (break each at a leaf module or a registration): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_import_circle_remains_counting_type_only_imports():
    """Annotations are dependencies too: an import under `if TYPE_CHECKING:` closes no circle either."""
    assert "distill.methods.base" in import_graph(type_checking=True)["distill.features"]  # annotations only
    found = circles(import_graph(type_checking=True))
    assert not found, "import circles through type-only imports: " + "; ".join(" <-> ".join(c) for c in found)


# The folders' layers, bottom first (the design, §3 Layout: leaves <- data, rendering, models <- generation,
# teachers, losses <- objectives <- methods, locations <- training, rundir, evaluation, serving, doctor <- commands,
# cli). A folder imports folders of its own layer or below; a new folder is placed here. `losses` imports no distill
# module but the leaf `no_grad`, and `models.vocabulary` builds its `LogitHead`, so it sits with the leaves;
# `conversations` holds the leaf modules (layout, tool calls, tools, environments) the data and the renderer read, the
# tool-call loop is `agents`.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("distill", "errors", "registry", "config", "settings", "seeds", "no_grad", "features", "version", "callables",
     "data_files", "images", "image_modes", "align", "recipes", "losses"),
    ("conversations", "data", "rendering", "models", "batch", "signals", "tasks"),
    ("generation", "agents", "teachers"),
    ("objectives",),
    ("methods", "locations"),
    ("training", "rundir", "evaluation", "serving", "doctor"),
    ("commands", "config_rules", "parts", "cli", "__main__"),
)


def folder_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def folder_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> the module pairs that make the edge."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if folder_of(module) != folder_of(target):
                edges.setdefault((folder_of(module), folder_of(target)), []).append(f"{module} -> {target}")
    return edges


def test_no_folder_circle_with_top_level_imports():
    graph = import_graph(top_level_only=True)
    folders: dict[str, set[str]] = {folder_of(name): set() for name in graph}
    for importer, imported in folder_edges(graph):
        folders[importer].add(imported)
    found = circles(folders)
    assert not found, "folder circles (move the misplaced module to its layer): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_folders_import_only_their_layer_or_below():
    graph = import_graph(top_level_only=True)
    layer = {folder: number for number, folders in enumerate(LAYERS) for folder in folders}
    unplaced = sorted({folder_of(name) for name in graph} - set(layer))
    assert not unplaced, f"folders missing from LAYERS (place each in its layer): {unplaced}"
    upward = [pair for (importer, imported), pairs in folder_edges(graph).items()
              if layer[imported] > layer[importer] for pair in pairs]
    assert not upward, "imports of a higher layer: " + "; ".join(upward)


def test_the_layer_check_sees_a_planted_upward_import():
    graph = import_graph(top_level_only=True)
    graph["distill.teachers.base"].add("distill.training.trainer")
    layer = {folder: number for number, folders in enumerate(LAYERS) for folder in folders}
    upward = [pair for (importer, imported), pairs in folder_edges(graph).items()
              if layer[imported] > layer[importer] for pair in pairs]
    assert upward == ["distill.teachers.base -> distill.training.trainer"]
