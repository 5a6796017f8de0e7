"""Train and held-out BFCL rows that share no function, so that a held-out score measures calling functions the
model never trained on.

Every function a row offers goes to the row's side, so rows that offer a common function (a `multiple` row offers
two to four) are tied together: the groups are the connected components of the graph whose nodes are function
names and whose edges join the functions of one row. The groups, sorted by their first name, are shuffled with
`random.Random(seed)`, and go to held-out in that order, each that still fits: held-out holds at most
round(`heldout_fraction` x rows) rows (as many as the groups allow), the rest are train. A group too large to fit
stays in train: in `simple_python` + `multiple`, the `multiple` rows chain 191 functions into one group of 295 of the
600 rows. Same data, same seed, same split, on any machine.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any


def offered_functions(row: dict[str, Any]) -> list[str]:
    """The names of the functions a row (with a `bfcl` column) offers."""
    return [function["name"] for function in json.loads(row["bfcl"])["functions"]]


def function_groups(rows: list[dict[str, Any]]) -> list[set[str]]:
    """The functions, grouped so that every row's functions fall in one group (union-find over names)."""
    parent: dict[str, str] = {}

    def root(name: str) -> str:
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for row in rows:
        names = offered_functions(row)
        for name in names[1:]:
            parent[root(name)] = root(names[0])
        root(names[0])
    groups: dict[str, set[str]] = {}
    for name in parent:
        groups.setdefault(root(name), set()).add(name)
    return sorted(groups.values(), key=min)


@dataclass(frozen=True)
class Split:
    train: list[dict[str, Any]]
    heldout: list[dict[str, Any]]
    train_functions: list[str]
    heldout_functions: list[str]


def split_by_function(rows: list[dict[str, Any]], heldout_fraction: float, seed: int) -> Split:
    """`rows` (in their order) divided into train and held-out sets with disjoint functions."""
    if not 0 < heldout_fraction < 1:
        raise ValueError(f"heldout_fraction must be between 0 and 1, got {heldout_fraction}")
    groups = function_groups(rows)
    random.Random(seed).shuffle(groups)
    group_of = {name: index for index, group in enumerate(groups) for name in group}
    sizes = [0] * len(groups)
    for row in rows:
        sizes[group_of[offered_functions(row)[0]]] += 1
    target, held_rows = round(heldout_fraction * len(rows)), 0
    heldout_groups: set[int] = set()
    for index, size in enumerate(sizes):
        if held_rows + size <= target:
            heldout_groups.add(index)
            held_rows += size
    held = [group_of[offered_functions(row)[0]] in heldout_groups for row in rows]
    heldout_functions = sorted(name for i in heldout_groups for name in groups[i])
    train_functions = sorted(name for i, group in enumerate(groups) if i not in heldout_groups for name in group)
    return Split([row for row, h in zip(rows, held) if not h], [row for row, h in zip(rows, held) if h],
                 train_functions, heldout_functions)
