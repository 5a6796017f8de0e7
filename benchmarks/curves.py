"""Shared by the benchmarks that draw learning curves (sums.py, sdft_frontier.py, agentic.py, bfcl.py): train a run
with `distill train`, keeping a checkpoint every few steps, then measure every checkpoint in this process; the tokens
each step sampled, each arm's last checkpoint over seeds, and the plot of a measure against steps, wall time and
sampled tokens.

A run directory holds, besides what `distill train` writes:
    train.json   the command, its wall time, the wall time at which each checkpoint was written
                 (the checkpoint's state.json mtime, so saving is counted; a checkpoint costs ~2 s here), and the
                 environment of each invocation that trained it (`provenance`, a list: see provenance.py)
    curve.json   one measured row per checkpoint (and step 0, the model before training, when asked)
Either file is reused by --resume; the checkpoints' weights are deleted once curve.json is written (they
are 1.6 GB each for the default model), unless keep_checkpoints.

A training run that was stopped (killed, or the machine went away) goes on from its last checkpoint under --resume
(`distill train --resume`, which draws exactly what the uninterrupted run would have: the curve is the same). Its wall
times stay those of one run: each invocation's start is kept beside the run directory (`<run>.invocations.json`, gone
once train.json is written), and a checkpoint's time is its invocation's offset (the time of the checkpoint it resumed
from) plus the time since that invocation started; the steps lost after the last checkpoint are not counted, the
resumed run's loading of the models (seconds) is counted once more.
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

from provenance import provenance  # a sibling script

from distill.rundir.checkpoint import PREFIX, list_checkpoints

CHECKPOINT_FLAGS = ["--save_total_limit", "0", "--logging_steps", "1", "--progress_bar", "false",
                    "--eval_before_after", "false", "--overwrite_output_dir", "true"]


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train(run_dir: Path, flags: list[str], resume: bool) -> dict:
    """`distill train --output_dir run_dir *flags` (plus CHECKPOINT_FLAGS), or the finished run's train.json; under
    `resume`, a stopped run goes on from its last checkpoint (module docstring)."""
    record = run_dir / "train.json"
    if resume and record.is_file():
        return json.loads(record.read_text())
    history_path = run_dir.parent / f"{run_dir.name}.invocations.json"
    history = json.loads(history_path.read_text()) if resume and history_path.is_file() else []
    done = list_checkpoints(run_dir) if history else []
    if done:
        resumed_from = int(done[-1].name.removeprefix(PREFIX))
        print(f"{run_dir}: going on from its checkpoint at step {resumed_from}", flush=True)
        command = [sys.executable, "-m", "distill", "train", "--resume", str(run_dir)]
    else:
        resumed_from, history = None, []
        command = [sys.executable, "-m", "distill", "train", "--output_dir", str(run_dir), *flags, *CHECKPOINT_FLAGS]
    start = time.time()
    history.append({"start": start, "resumed_from": resumed_from, "command": " ".join(command[1:]),
                    "provenance": provenance()})
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    history_path.write_text(json.dumps(history, indent=2))
    try:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    except subprocess.CalledProcessError:
        # An invocation that failed before writing a checkpoint (another run holds the directory, a bad flag) trained
        # nothing: left in the history, it would be taken for the start of the checkpoints written after it.
        if not any((path / "state.json").stat().st_mtime >= start for path in list_checkpoints(run_dir)):
            history.pop()
            if history:
                history_path.write_text(json.dumps(history, indent=2))
            else:
                history_path.unlink()
        raise
    written = checkpoint_seconds(run_dir, history)
    result = {"command": history[0]["command"], "seconds": seconds_since(history, written, time.time()),
              "checkpoint_seconds": {str(step): written[step] for step in sorted(written)},
              "provenance": [entry.get("provenance") for entry in history]}
    if len(history) > 1:
        result["resumed_from_steps"] = [entry["resumed_from"] for entry in history[1:]]
    record.write_text(json.dumps(result, indent=2))
    history_path.unlink()
    return result


def checkpoint_seconds(run_dir: Path, history: list[dict]) -> dict[int, float]:
    """step -> the run's wall time when that checkpoint was written, over every invocation in `history` (each one's
    checkpoints counted from its start, plus the time of the checkpoint it resumed from)."""
    seconds: dict[int, float] = {}
    for path in list_checkpoints(run_dir):
        written = (path / "state.json").stat().st_mtime
        invocation = [entry for entry in history if entry["start"] <= written][-1]
        offset = 0.0 if invocation["resumed_from"] is None else seconds[invocation["resumed_from"]]
        seconds[int(path.name.removeprefix(PREFIX))] = offset + written - invocation["start"]
    return seconds


def seconds_since(history: list[dict], written: dict[int, float], now: float) -> float:
    """The whole run's wall time: the last invocation's, after the time of the checkpoint it resumed from."""
    last = history[-1]
    return (0.0 if last["resumed_from"] is None else written[last["resumed_from"]]) + now - last["start"]


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
    parser.add_argument("--resume", action="store_true",
                        help="keep the runs and measurements an earlier invocation finished; go on with a run it left at a checkpoint")
    parser.add_argument("--arms", nargs="*", default=list(arms), help="arms to run (default: all, in order)")
    args = parser.parse_args()
    unknown = sorted(set(args.arms) - set(arms))
    if unknown:
        parser.error(f"unknown arms {unknown}; the arms are {list(arms)}")
    return args


def sampled_tokens_per_step(run_dir: Path, batch: int) -> dict[int, float]:
    """Tokens sampled at each step of a run logged every step: the completions of its student and teacher micro-batches
    (`batch` rows each), without the tool turns (tools/environment_token_fraction)."""
    per_step = {}
    for record in metrics(run_dir):
        completions = sum(record.get(f"completion_length/{s}", 0.0) * record.get(f"micro_batches/{s}", 0.0)
                          for s in ("student", "teacher"))
        per_step[int(record["step"])] = completions * batch * (1.0 - record.get("tools/environment_token_fraction", 0.0))
    return per_step


def with_sampled_tokens(rows: list[dict], run_dir: Path, batch: int) -> list[dict]:
    """`rows` with "sampled_tokens": the tokens sampled through each row's step (when the run's metrics are here)."""
    if not (run_dir / "metrics.jsonl").is_file():
        return rows
    per_step = sampled_tokens_per_step(run_dir, batch)
    return [{**row, "sampled_tokens": through(per_step, row["step"])} for row in rows]


def through(per_step: dict[int, float], step: int) -> float:
    """The sum of a per-step count over steps 1 to `step`."""
    return sum(v for s, v in per_step.items() if s <= step)


def with_rewarded_answers(rows: list[dict], run_dir: Path, answers_per_step: int) -> list[dict]:
    """`rows` with "rewarded_answers": how many sampled answers through each row's step earned a reward (the step's
    mean reward, logged as reward/mean, times its `answers_per_step` answers; a 0/1 reward counts them exactly). Only
    for a run that logs rewards (GRPO and SDPO); other rows are returned as they are. Where it stays 0, every group's
    advantage was 0 and GRPO had no gradient."""
    if not (run_dir / "metrics.jsonl").is_file():
        return rows
    per_step = {int(r["step"]): r["reward/mean"] * answers_per_step for r in metrics(run_dir) if "reward/mean" in r}
    if not per_step:
        return rows
    return [{**row, "rewarded_answers": through(per_step, row["step"])} for row in rows]


def with_training_signal(rows: list[dict], run_dir: Path, keys: tuple[str, ...] = ("grad_norm", "forward_kl")) -> list[dict]:
    """`rows` (sorted by step) with "<key>_mean" for each of `keys` the run logged: its mean over the steps since the
    previous row (steps 1 to the first row's step for the first). grad_norm says whether a loss still moved the
    student; forward_kl, the teacher's KL to the student per sampled token, how far the student's answers were from
    what the teacher would write: a loss can fall silent (a JSD saturates) while the student is far from the teacher.
    A step logged twice (a resumed run) counts once; a run without metrics.jsonl gets its rows back as they are."""
    if not (run_dir / "metrics.jsonl").is_file():
        return rows
    logged = {int(r["step"]): r for r in metrics(run_dir)}
    out, previous = [], 0
    for row in rows:
        window = [logged[s] for s in sorted(logged) if previous < s <= row["step"]]
        means = {f"{key}_mean": sum(r[key] for r in window if key in r) / count
                 for key in keys if (count := sum(key in r for r in window))}
        out.append({**row, **means})
        previous = row["step"]
    return out


def final_rows(results: dict, measure: str) -> dict:
    """Each arm's last checkpoint (seed 0's `results["arms"]`), with its training minutes and `measure` for every seed
    measured (`results["repeats"]`): "<measure>_by_seed", "<measure>_mean", "seeds"."""
    final = {}
    for name, rows in results["arms"].items():
        by_seed = {"0": rows[-1][measure]} | {seed: arms_of[name]["rows"][-1][measure]
                                             for seed, arms_of in results.get("repeats", {}).items() if name in arms_of}
        final[name] = {**rows[-1], "minutes": results["seconds"][name] / 60, f"{measure}_by_seed": by_seed,
                       f"{measure}_mean": sum(by_seed.values()) / len(by_seed), "seeds": len(by_seed)}
    return final


def plot_curves(results: dict, path: Path, measure: str, label: str) -> None:
    """`measure` (0 to 1, `label` on the y axis) against steps, wall time (seed 0's runs, alone on the machine) and
    sampled tokens, from `results["arms"]` (seed 0, solid) and `results["repeats"]` (dotted); the arm "teacher" as a
    dashed line at its last value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_of = [("step", "optimizer step", 1.0), ("seconds", "wall time (minutes)", 1 / 60),
               ("sampled_tokens", "sampled tokens (thousands)", 1e-3)]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    curves = [(name, "0", rows) for name, rows in results["arms"].items()]
    curves += [(name, seed, arm["rows"]) for seed, arms in results.get("repeats", {}).items() for name, arm in arms.items()]
    colours: dict[str, str] = {}
    for axis, (key, axis_label, scale) in zip(axes, axes_of):
        for name, seed, rows in curves:
            if name == "teacher":
                axis.axhline(rows[-1][measure], color="#555", linestyle="--", label="teacher (sft)" if seed == "0" else None)
                continue
            if any(key not in r for r in rows[1:]) or (key == "seconds" and seed != "0"):
                continue  # repeats ran beside other jobs: their wall time is not comparable
            colour = colours.setdefault(name, f"C{len(colours)}")
            axis.plot([r.get(key, 0.0) * scale for r in rows], [r[measure] for r in rows], marker="o", color=colour,
                      linestyle="-" if seed == "0" else ":", label=name if seed == "0" else f"{name}, seed {seed}")
        axis.set_xlabel(axis_label)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel(label)
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def with_teacher_sampling(rows: list[dict], sampling: dict, steps: int) -> list[dict]:
    """The rows of an arm trained on the teacher's samples drawn before its first step (`sampling`: their
    "teacher_tokens" and "seconds"): the tokens spread evenly over the `steps` trained, the sampling's time added to
    every checkpoint's wall time."""
    return [{**r, "seconds": r["seconds"] + sampling["seconds"],
             "sampled_tokens": sampling["teacher_tokens"] * r["step"] / steps} for r in rows]
