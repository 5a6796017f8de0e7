"""Shared by the benchmarks that compare training arms (sdft.py, sdpo.py): measure the model before
training once, then train and measure each arm in turn, keeping finished parts on disk for --resume."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Callable

from provenance import provenance, record_part  # a sibling script


def finished(path: Path, resume: bool) -> dict | None:
    return json.loads(path.read_text()) if resume and path.is_file() else None


def run_arms(runs: Path, arms: dict[str, tuple[str, list[str]]], resume: bool, before: Callable[[], dict],
             train: Callable[[Path, list[str]], dict], measure: Callable[[Path], dict],
             parts: dict) -> dict[str, dict]:
    """{"before training": before(), arm name: train(run_dir, flags) updated with measure(run_dir)}.

    `arms` maps a name to (run directory under `runs`, flags); each finished part writes its JSON
    (before.json, RUN_DIR/bench_row.json), which --resume (`resume`) reads instead of redoing it. The environment
    each part was made in is kept in its JSON and recorded in `parts` under "results/<name>" (provenance.py)."""
    runs.mkdir(parents=True, exist_ok=True)
    results = {"before training": made_once(runs / "before.json", resume, before, parts, "before training")}
    for name, (directory, flags) in arms.items():
        run_dir = runs / directory
        results[name] = made_once(run_dir / "bench_row.json", resume,
                                  partial(trained_and_measured, train, measure, run_dir, flags), parts, name)
    return results


def made_once(path: Path, resume: bool, make: Callable[[], dict], parts: dict, name: str) -> dict:
    """The part's row: read from `path` under `resume` when an earlier invocation finished it, else made now and
    written there with the environment it was made in; that environment is recorded in `parts`."""
    row = finished(path, resume)
    if row is None:
        row = {**make(), "provenance": [provenance()]}
        path.write_text(json.dumps(row, indent=2))
    record_part(parts, f"results/{name}", row.pop("provenance", None))
    return row


def trained_and_measured(train: Callable[[Path, list[str]], dict], measure: Callable[[Path], dict], run_dir: Path,
                         flags: list[str]) -> dict:
    return {**train(run_dir, flags), **measure(run_dir)}
