"""Completion sources compared at equal wall time on the bundled default (teacher SmolLM2-135M-Instruct).

Each configuration trains the same student (the teacher minus every third layer) for the same number of
training minutes, then the held-out evaluation measures forward KL on teacher completions, reverse KL on
the student's own, and top-1 agreement. Runs are sequential (one at a time on the machine).

    python benchmarks/sources.py --minutes 6 [--max_new_tokens 48 ...]
Writes benchmarks/results/sources.json and prints a table. The second phase compared (JSD on the
student's samples vs IW-OPD vs sampled-token OPD, gamma 0), after the same teacher-sampled phase:

    python benchmarks/sources.py --minutes 10 --switch-step 30 --configs iw_opd opd_gamma0 schedule \
        --out benchmarks/results/sources_iw_opd.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment

# The published table was measured with one teacher generate call per step (seq_kd_generation_steps 1).
COMMON = ["--learning_rate", "1e-4", "--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "5", "--max_steps", "1000",
          "--save_steps", "0", "--progress_bar", "false"]
CONFIGS = {
    "on_policy": ["--method", "on_policy", "--beta", "0.5"],
    "off_policy": ["--seq_kd", "true", "--seq_kd_generation_steps", "1", "--lmbda", "0", "--lmbda_schedule", "constant", "--off_policy_beta", "0"],
    "mixed": ["--seq_kd", "true", "--seq_kd_generation_steps", "1", "--lmbda", "0.5", "--lmbda_schedule", "constant", "--off_policy_beta", "0", "--beta", "0.5"],
    "schedule": ["--seq_kd", "true", "--seq_kd_generation_steps", "1", "--lmbda", "0.5", "--lmbda_schedule", "step", "--lmbda_start", "0",
                 "--lmbda_schedule_steps", "{half}", "--off_policy_beta", "0", "--beta", "0.5"],
    # The same teacher-sampled phase, then a sampled-token policy gradient on the student's own samples.
    "iw_opd": ["--method", "iw_opd", "--teacher_warmup_steps", "{half}", "--seq_kd_generation_steps", "1"],
    "opd_gamma0": ["--method", "iw_opd", "--teacher_warmup_steps", "{half}", "--seq_kd_generation_steps", "1",
                   "--iw_opd_gamma", "0"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=6.0, help="training minutes per configuration")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--switch-step", type=int, default=30, help="'schedule', 'iw_opd', 'opd_gamma0': the step where on-policy starts")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench-sources"))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sources.json")
    args, extra = parser.parse_known_args()
    args.extra = extra  # any other `distill train` flags, applied to every run

    rows = []
    for name in args.configs:
        run_dir = args.runs / name
        flags = [f.replace("{half}", str(args.switch_step)) for f in CONFIGS[name]]
        command = [sys.executable, "-m", "distill", "train", "--output_dir", str(run_dir), "--overwrite_output_dir", "true",
                   "--max_time_minutes", str(args.minutes), *COMMON, *flags, *args.extra]
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        report = json.loads((run_dir / "eval" / "eval.json").read_text())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        before, after = report["metrics"]["before"], report["metrics"]["after"]
        row = {
            "config": name, "flags": flags, "steps": metrics[-1]["step"], "wall_seconds": wall,
            "forward_kl_teacher_before": before["on_teacher_completions"]["forward_kl"],
            "forward_kl_teacher_after": after["on_teacher_completions"]["forward_kl"],
            "reverse_kl_own_before": before["on_student_completions"]["reverse_kl"],
            "reverse_kl_own_after": after["on_student_completions"]["reverse_kl"],
            "top1_teacher_after": after["on_teacher_completions"]["top1_agreement"],
            "example_after": report["examples"][0]["student_after"],
        }
        rows.append(row)
        print(f"{name:>10}: {row['steps']} steps, forward KL {row['forward_kl_teacher_before']:.2f} -> "
              f"{row['forward_kl_teacher_after']:.2f}, reverse KL (own) {row['reverse_kl_own_before']:.2f} -> "
              f"{row['reverse_kl_own_after']:.2f}, top-1 {row['top1_teacher_after']:.3f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, {"minutes": args.minutes, "rows": rows}, ensure_ascii=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
