"""A config field's help: its own text, then what the registry says of it, generated when asked so that it
cannot go stale when a method is added or changes what it reads.

- `method`: every registered method with its summary;
- a field some methods read: which, and when (`Method.reads`);
- a field whose default is None and which a method fills in: each method's value (`Method.defaults`);
- a teacher location (`teacher_url`, `teacher_cache`): the methods a run with it validates for.

`field_groups` orders the fields for `distill train --help` by the part that reads them: every run, the
teacher's location, each method's own, then those several methods read.
"""

from __future__ import annotations

import re

from distill.config import DistillConfig
from distill.config_rules.reads import own_fields, run_reads
from distill.locations.registry import locations
from distill.methods.base import get_method, method_names


def field_help(name: str) -> str:
    """The help text of config field `name`, with the generated facts appended."""
    field = {f.name: f for f in DistillConfig.config_fields()}[name]
    parts = [field.metadata.get("help", "")]
    if name == "method":
        parts += [f"'{m}': {get_method(m).summary}." for m in method_names()]
    if name in selecting_fields():
        methods = location_methods(name)
        parts.append(f"Methods that can learn from it: {', '.join(methods) if methods else 'none'}.")
    readers = method_readers(name)
    if readers:
        parts.append(readers_sentence(readers))
    defaults = [(m, get_method(m).defaults[name]) for m in method_names() if name in get_method(m).defaults]
    if defaults:
        parts.append("Method defaults: " + ", ".join(f"{m} {value!r}" for m, value in defaults) + ".")
    return " ".join(p for p in parts if p)


def method_readers(name: str) -> list[tuple[str, str]]:
    """(method, when) for each method that declares reading `name` itself; nothing for a field every run
    reads (`distill.config_rules.reads.run_reads`)."""
    shared = {n for part in run_reads(frozenset({"student", "dataset", "teacher"})) for n in part.names}
    if name in shared:
        return []
    found = []
    for method in method_names():
        needs = next((part.needs for part in get_method(method).reads if name in part.names), None)
        if needs is not None:
            found.append((method, needs.removeprefix(f"method {method}").strip(" ,") or "always"))
    return found


def readers_sentence(readers: list[tuple[str, str]]) -> str:
    """`method_readers` as one sentence, each condition written once with the methods it holds for:
    "Read by gkd, on_policy and sdft; by gold with uld_use_hybrid_loss: true." A condition that names its methods in
    a trailing "(methods ...)" loses it (the sentence names them)."""
    by_condition: dict[str, list[str]] = {}
    for method, needs in readers:
        by_condition.setdefault(re.sub(r"\s*\(methods? [^()]*\)$", "", needs), []).append(method)
    clauses = []
    for needs, methods in by_condition.items():
        names = methods[0] if len(methods) == 1 else f"{', '.join(methods[:-1])} and {methods[-1]}"
        clauses.append(names if needs == "always" else f"{names} with {needs}")
    return "Read by " + "; by ".join(clauses) + "."


def selecting_fields() -> dict[str, tuple]:
    """field -> (example value, settings a run with it needs) for each location a field selects
    (`TeacherLocation.selected_by`: a server or a cache cannot sample, and a cache scores only its own completions)."""
    return {loc.selected_by[0]: loc.selected_by[1:] for loc in locations() if loc.selected_by}


def location_methods(name: str) -> list[str]:
    """The registered methods that validate with the teacher at the location field `name` selects (some settings for it)."""
    value, settings = selecting_fields()[name]
    accepted = []
    for method in method_names():
        for extra in settings:
            try:
                DistillConfig(method=method, student="a-student", **{name: value}, **extra).validate()
            except ValueError:
                continue
            accepted.append(method)
            break
    return accepted


def field_groups() -> list[tuple[str, list[str]]]:
    """(title, field names) in the config's order: the fields every run reads (`distill.config_rules.reads.run_reads`), the
    teacher locations', each registered method's own (read by it alone), then those several methods read."""
    every = DistillConfig.field_names()
    at_location = {n for location in locations() for part in location.reads for n in part.names}
    shared = {n for part in run_reads(frozenset({"student", "dataset", "teacher"})) for n in part.names} - at_location
    readers: dict[str, list[str]] = {}
    for method in method_names():
        reads = {n for part in get_method(method).reads for n in part.names} | set(own_fields(get_method(method)))
        for name in reads - shared - at_location:
            readers.setdefault(name, []).append(method)
    groups = [("every run", [n for n in every if n in shared]),
              ("where the teacher lives (teacher, teacher_url, teacher_cache)", [n for n in every if n in at_location])]
    groups += [(f"method {method}", [n for n in every if readers.get(n) == [method]]) for method in method_names()]
    groups.append(("several methods (each field's help names which)", [n for n in every if len(readers.get(n, ())) > 1]))
    placed = {n for _, names in groups for n in names}
    groups.append(("read by no registered part", [n for n in every if n not in placed]))
    return [(title, names) for title, names in groups if names]
