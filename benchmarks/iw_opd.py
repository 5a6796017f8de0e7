"""The second phase compared at equal wall time on the bundled pair: after the same teacher-sampled phase,
the default's mix (JSD beta 0.5 on the student's own samples, forward KL on teacher samples) vs IW-OPD vs
sampled-token OPD (IW-OPD with gamma 0).

Phase 1 runs once (`distill train` with teacher samples and forward KL, the default's first phase); each
arm then starts from its model with a fresh optimizer and trains for the same number of minutes. `distill
eval` measures every model on the held-out prompts: forward KL on teacher completions, reverse KL on the
student's own, top-1 agreement. Runs are sequential (one at a time on the machine).

    python benchmarks/iw_opd.py --phase1-steps 20 --minutes 5 [--resume]
Writes benchmarks/results/iw_opd.json and prints a table. --resume keeps the parts of an earlier invocation
with the same --runs that finished (each writes bench_row.json), so a stopped benchmark continues.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment

COMMON = ["--learning_rate", "1e-4", "--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "5", "--save_steps", "0",
          "--progress_bar", "false", "--eval_before_after", "false"]
PHASE1 = ["--seq_kd", "true", "--seq_kd_generation_steps", "1", "--lmbda", "0", "--lmbda_schedule", "constant",
          "--off_policy_beta", "0"]
ARMS = {
    "default mix (JSD on own samples, lmbda 0.5)": ["--seq_kd", "true", "--seq_kd_generation_steps", "1", "--lmbda", "0.5",
                                                     "--lmbda_schedule", "constant", "--beta", "0.5", "--off_policy_beta", "0"],
    "IW-OPD (gamma 0.5)": ["--method", "iw_opd"],
    "sampled-token OPD (gamma 0)": ["--method", "iw_opd", "--iw_opd_gamma", "0"],
}


def train(run_dir: Path, flags: list[str]) -> float:
    command = [sys.executable, "-m", "distill", "train", "--output_dir", str(run_dir), "--overwrite_output_dir", "true",
               *COMMON, *flags]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def evaluate(run_dir: Path) -> dict:
    subprocess.run([sys.executable, "-m", "distill", "eval", str(run_dir)], check=True, stdout=subprocess.DEVNULL)
    report = json.loads((run_dir / "eval-cli" / "eval.json").read_text())
    metrics = report["metrics"]["student"]
    return {"forward_kl_teacher": metrics["on_teacher_completions"]["forward_kl"],
            "reverse_kl_own": metrics["on_student_completions"]["reverse_kl"],
            "top1_teacher": metrics["on_teacher_completions"]["top1_agreement"],
            "example": report["examples"][0]["student_student"] if report.get("examples") else None}


def finished(run_dir: Path, resume: bool) -> dict | None:
    """The row an earlier invocation recorded for `run_dir`, when resuming."""
    path = run_dir / "bench_row.json"
    return json.loads(path.read_text()) if resume and path.is_file() else None


def record(run_dir: Path, row: dict) -> dict:
    (run_dir / "bench_row.json").write_text(json.dumps(row, indent=2, ensure_ascii=False))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase1-steps", type=int, default=20, help="teacher-sampled steps before the arms split")
    parser.add_argument("--minutes", type=float, default=5.0, help="training minutes of each arm's second phase")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench-iw-opd"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "iw_opd.json")
    parser.add_argument("--resume", action="store_true", help="keep the finished parts of an earlier invocation")
    args = parser.parse_args()

    phase1 = args.runs / "phase1"
    start = finished(phase1, args.resume)
    if start is None:
        phase1_seconds = train(phase1, [*PHASE1, "--max_steps", str(args.phase1_steps)])
        start = record(phase1, {"config": "after phase 1", "steps": args.phase1_steps, "wall_seconds": phase1_seconds,
                                **evaluate(phase1)})
    print(f"phase 1: {start['steps']} steps in {start['wall_seconds']:.0f} s, forward KL {start['forward_kl_teacher']:.3f}, "
          f"reverse KL (own) {start['reverse_kl_own']:.3f}", flush=True)
    rows = [start]
    for index, (name, flags) in enumerate(ARMS.items()):
        run_dir = args.runs / f"arm{index}"
        row = finished(run_dir, args.resume)
        if row is None:
            seconds = train(run_dir, [*flags, "--student", str(phase1 / "model"), "--student_init", "all",
                                      "--max_steps", "1000", "--max_time_minutes", str(args.minutes)])
            steps = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]
            row = record(run_dir, {"config": name, "flags": flags, "steps": steps, "wall_seconds": seconds, **evaluate(run_dir)})
        rows.append(row)
        print(f"{name}: {row['steps']} steps, forward KL {row['forward_kl_teacher']:.3f}, reverse KL (own) "
              f"{row['reverse_kl_own']:.3f}, top-1 {row['top1_teacher']:.3f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, {"phase1_steps": args.phase1_steps, "minutes": args.minutes, "rows": rows}, ensure_ascii=False)
    print("\n| second phase | steps | forward KL on teacher completions | reverse KL on own completions | top-1 agreement |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['config']} | {row['steps']} | {row['forward_kl_teacher']:.3f} | {row['reverse_kl_own']:.3f} | "
              f"{row['top1_teacher']:.3f} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
