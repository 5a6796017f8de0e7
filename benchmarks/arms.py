"""Shared by the benchmarks that compare training arms (sdft.py, sdpo.py): measure the model before
training once, then train and measure each arm in turn, keeping finished parts on disk for --resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


def finished(path: Path, resume: bool) -> dict | None:
    return json.loads(path.read_text()) if resume and path.is_file() else None


def run_arms(runs: Path, arms: dict[str, tuple[str, list[str]]], resume: bool, before: Callable[[], dict],
             train: Callable[[Path, list[str]], dict], measure: Callable[[Path], dict]) -> dict[str, dict]:
    """{"before training": before(), arm name: train(run_dir, flags) updated with measure(run_dir)}.

    `arms` maps a name to (run directory under `runs`, flags); each finished part writes its JSON
    (before.json, RUN_DIR/bench_row.json), which --resume (`resume`) reads instead of redoing it."""
    runs.mkdir(parents=True, exist_ok=True)
    row = finished(runs / "before.json", resume)
    if row is None:
        row = before()
        (runs / "before.json").write_text(json.dumps(row, indent=2))
    results = {"before training": row}
    for name, (directory, flags) in arms.items():
        run_dir = runs / directory
        row = finished(run_dir / "bench_row.json", resume)
        if row is None:
            row = train(run_dir, flags)
            row.update(measure(run_dir))
            (run_dir / "bench_row.json").write_text(json.dumps(row, indent=2))
        results[name] = row
    return results
