"""A row's model inputs beyond its token ids (`Extra`), and how rows of them make a batch (`collate_extras`).

A leaf module (torch only): the dataset rows (`distill.data`), the micro-batches (`distill.batch`) and the
engines' requests (`distill.generation`) all hold extras. What a row's extras are is its model kind's
(`distill.models.kinds`); everything else moves them by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Extra:
    """One row's model input beyond its token ids, and how rows of it make a batch.

    layout "row": the row's tensor (...) is stacked with the other rows' into (B, ...); every row of a batch
        holds one, of one shape (a per-row tensor);
    layout "flat": the rows' tensors (n_i, ...) are concatenated along dim 0 into (sum n_i, ...) (image
        patches: every image of every row, in row order), rows may hold none (n_i = 0).
    """

    value: torch.Tensor
    layout: str = "row"

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"an extra's layout must be one of {LAYOUTS}, got {self.layout!r}")


LAYOUTS = ("row", "flat")


class DeferredExtras(Mapping):
    """A row's extras computed when a batch needs them (an image row's pixel values: decoding every image of a
    dataset at start would hold them all in memory). Its names are known without computing anything;
    `load()` computes all of them (`collate_extras` calls it once per row and batch, and keeps nothing)."""

    def __init__(self, names: tuple[str, ...], loader: Callable[[], dict[str, Extra]]):
        self.names, self._loader = tuple(names), loader

    def load(self) -> dict[str, Extra]:
        loaded = self._loader()
        if set(loaded) != set(self.names):
            raise ValueError(f"a row's deferred model inputs gave {sorted(loaded)}, announced as {sorted(self.names)}")
        return loaded

    def __getitem__(self, name: str) -> Extra:
        return self.load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"DeferredExtras({list(self.names)})"


RowExtras = Mapping[str, Extra]  # one row's extras, by the model's forward argument name (a dict, or DeferredExtras)


def materialized(row: RowExtras) -> dict[str, Extra]:
    """A row's extras as a dict of tensors (a `DeferredExtras` computed now)."""
    return row.load() if isinstance(row, DeferredExtras) else dict(row)


def collate_extras(rows: list[RowExtras]) -> dict[str, torch.Tensor]:
    """The batch's extras (module docstring of `Extra`) from each row's; every row names the same inputs."""
    rows = [materialized(row) for row in rows]
    names = set(rows[0]) if rows else set()
    if any(set(row) != names for row in rows):
        raise ValueError(f"rows of one batch carry different model inputs: {sorted({n for row in rows for n in row})}; "
                         "every row of a model kind carries the same ones")
    batch = {}
    for name in sorted(names):
        layouts = {row[name].layout for row in rows}
        if len(layouts) != 1:
            raise ValueError(f"model input {name!r} has layouts {sorted(layouts)} in one batch")
        values = [row[name].value for row in rows]
        if layouts == {"row"}:
            if len({tuple(v.shape) for v in values}) != 1:
                raise ValueError(f"model input {name!r} ('row' layout) has shapes {sorted({tuple(v.shape) for v in values})}; "
                                 "stacking needs one shape (use the 'flat' layout for rows of different sizes)")
            batch[name] = torch.stack(values)
        else:
            batch[name] = torch.cat(values)
    return batch
