"""Shared by the benchmarks that draw learning curves (sums.py, sdft_frontier.py): train a run with
`distill train`, keeping a checkpoint every few steps, then measure every checkpoint in this process.

A run directory holds, besides what `distill train` writes:
    train.json   the command, its wall time, and the wall time at which each checkpoint was written
                 (the checkpoint's state.json mtime, so saving is counted; a checkpoint costs ~2 s here)
    curve.json   one measured row per checkpoint (and step 0, the model before training, when asked)
Either file is reused by --resume; the checkpoints' weights are deleted once curve.json is written (they
are 1.6 GB each for the default model), unless keep_checkpoints.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

CHECKPOINT_FLAGS = ["--save_total_limit", "0", "--logging_steps", "1", "--progress_bar", "false",
                    "--eval_before_after", "false", "--overwrite_output_dir", "true"]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train(run_dir: Path, flags: list[str], resume: bool) -> dict:
    """`distill train --output_dir run_dir *flags` (plus CHECKPOINT_FLAGS), or the finished run's train.json."""
    record = run_dir / "train.json"
    if resume and record.is_file():
        return json.loads(record.read_text())
    command = [sys.executable, "-m", "distill", "train", "--output_dir", str(run_dir), *flags, *CHECKPOINT_FLAGS]
    start = time.time()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    seconds = time.time() - start
    written = {int(path.parent.name.split("-")[-1]): path.stat().st_mtime - start
               for path in (run_dir / "checkpoints").glob("*/state.json")}
    result = {"command": " ".join(command[1:]), "seconds": seconds,
              "checkpoint_seconds": {str(step): written[step] for step in sorted(written)}}
    record.write_text(json.dumps(result, indent=2))
    return result


def checkpoint_students(run_dir: Path) -> dict[int, Path]:
    """step -> the checkpoint's student directory (a loadable model)."""
    return {int(path.parent.name.split("-")[-1]): path
            for path in sorted((run_dir / "checkpoints").glob("*/student"))}


def curve(run_dir: Path, measure: Callable[[Path], dict], resume: bool, keep_checkpoints: bool = False) -> list[dict]:
    """[{"step": s, "seconds": wall time at checkpoint s, **measure(student dir)}, ...] for every checkpoint."""
    path = run_dir / "curve.json"
    if resume and path.is_file():
        return json.loads(path.read_text())
    seconds = json.loads((run_dir / "train.json").read_text())["checkpoint_seconds"]
    rows = [{"step": step, "seconds": seconds[str(step)], **measure(student)}
            for step, student in checkpoint_students(run_dir).items()]
    path.write_text(json.dumps(rows, indent=2))
    if not keep_checkpoints:
        shutil.rmtree(run_dir / "checkpoints")
    return rows


def measuring_seconds(run_dir: Path) -> float:
    """Wall time spent measuring the run's checkpoints: from train.json's writing to curve.json's."""
    return (run_dir / "curve.json").stat().st_mtime - (run_dir / "train.json").stat().st_mtime


def parse_arm_arguments(parser: argparse.ArgumentParser, arms: dict, out: str) -> argparse.Namespace:
    """Add --out (default `out`), --resume and --arms (names of `arms`, default all, in order) and parse."""
    parser.add_argument("--out", default=out)
    parser.add_argument("--resume", action="store_true", help="keep the runs and measurements an earlier invocation finished")
    parser.add_argument("--arms", nargs="*", default=list(arms), help="arms to run (default: all, in order)")
    args = parser.parse_args()
    unknown = sorted(set(args.arms) - set(arms))
    if unknown:
        parser.error(f"unknown arms {unknown}; the arms are {list(arms)}")
    return args
