"""A bundled recipe end to end, as a user runs it: `distill train [RECIPE]`, timed.

Runs `python -m distill train RECIPE` (nothing overridden but the run directory; no recipe: the bundled
default, the README's first command) in a child process, then records its wall time from start to the
printed report, the child's peak resident memory, the optimizer steps, and the run's held-out evaluation
(`eval/eval.json`: before and after, with the side-by-side greedy answers). The Quickstart and the method
guides render their tables of a recipe's outcome from this file.

    python benchmarks/recipe_run.py                 # the default: about 8 minutes on 2 CPU cores
    python benchmarks/recipe_run.py --recipe gold   # about 10 minutes
Writes benchmarks/results/recipe_<name>.json (name `default` without a recipe) and prints the evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment


def data_counts(run_dir: Path) -> dict:
    """The rows (and the distinct images they show) the run trained on and was evaluated on, from its config.yaml."""
    import yaml

    from distill.data_files import load_dataset_spec

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    counts = {}
    for name, spec, split in (("train", config["dataset"], config["dataset_split"]),
                              ("eval", config.get("eval_dataset") or config["dataset"], config["eval_split"])):
        rows = load_dataset_spec(spec, split, name)
        counts[f"{name}_rows"] = len(rows)
        if "images" in rows.column_names:
            counts[f"{name}_images"] = len({image for shown in rows["images"] for image in shown or ()})
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=None, help="a bundled recipe name or a YAML path; none: the default")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench-recipes"))
    parser.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/recipe_<name>.json")
    args = parser.parse_args()
    name = Path(args.recipe).stem if args.recipe else "default"
    run_dir = args.runs / name
    out = args.out or Path(__file__).parent / "results" / f"recipe_{name}.json"

    command = [sys.executable, "-m", "distill", "train", *([args.recipe] if args.recipe else []),
               "--output_dir", str(run_dir), "--overwrite_output_dir", "true", "--progress_bar", "false"]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    peak_rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    result = {"command": " ".join(["distill", "train", *([args.recipe] if args.recipe else [])]),
              "wall_minutes": wall / 60, "peak_rss_gb": peak_rss_kib / 1024 ** 2,
              "last_step": max((m.get("step", 0) for m in metrics), default=0),
              "machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)),
              "data": data_counts(run_dir),
              "eval": json.loads((run_dir / "eval" / "eval.json").read_text())}
    write_result(out, result)
    print(f"{result['command']}: {wall / 60:.1f} minutes, peak RSS {result['peak_rss_gb']:.2f} GB, {result['last_step']} steps; {out}")


if __name__ == "__main__":
    main()
