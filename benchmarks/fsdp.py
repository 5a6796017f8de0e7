"""Memory per process of DDP vs FSDP (`fsdp: true`) on 2 CPU processes for the default teacher/student pair.

    python benchmarks/fsdp.py                  # 2 processes (torchrun), DDP then FSDP, 2 optimizer steps each

Each configuration runs in its own `torchrun --nproc_per_node 2` launch of the default recipe (gkd, with
on-policy and teacher-sampled micro-batches mixed, lmbda 0.5, so both the gathered student's generation and
the teacher's run), short settings. Per process it reports the bytes this process holds of the student's
parameters, of their gradients (measured just before the optimizer step) and of AdamW's state, the teacher's
bytes (replicated: the teacher is frozen and not sharded), and resident memory (Linux /proc): before the steps,
the peak during the steps (which also counts activations, the parameters gathered for generation, gloo's
buffers), and the peak of the whole process (set while the GGUF teacher is loaded and dequantised).
Writes benchmarks/results/fsdp.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment

MB = 2**20


def local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors)


def resident_mb(field: str) -> float:
    """A /proc/self/status memory line (VmRSS: now; VmHWM: the peak since start or the last clear_refs), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def worker(args) -> None:
    import torch

    from distill import DistillConfig
    from distill.training.trainer import Distiller

    config = DistillConfig(fsdp=args.mode == "fsdp", max_steps=args.steps, lmbda_schedule="constant", lmbda=0.5,
                           seq_kd_generation_steps=1, per_device_train_batch_size=2, gradient_accumulation_steps=2,
                           max_new_tokens=args.new_tokens, eval_before_after=False, progress_bar=False, save_steps=0,
                           logging_steps=1, output_dir=args.out_dir, overwrite_output_dir=True)
    distiller = Distiller(config)
    distiller.setup()
    state = distiller.state
    assert state is not None, "setup() made the training state"
    grad_bytes = []
    step = state.optimizer.optimizer.step

    def measured_step(*a, **k):
        grad_bytes.append(local_bytes(p.grad for p in state.wrapped.parameters() if p.grad is not None))
        return step(*a, **k)

    state.optimizer.optimizer.step = measured_step
    resident_at_start = resident_mb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak resident size (VmHWM) restarts from now
    start = time.perf_counter()
    for index in range(args.steps):
        distiller.train_step(index, distiller._new_window(), {}, log_step=False)
    seconds = (time.perf_counter() - start) / args.steps
    optimizer_state = [v for state in state.optimizer.optimizer.state.values() for v in state.values()
                       if isinstance(v, torch.Tensor)]
    result = {
        "mode": args.mode, "rank": distiller.parts.runtime.process_index,
        "parameters_mb": local_bytes(state.wrapped.parameters()) / MB,
        "gradients_mb": max(grad_bytes) / MB,
        "optimizer_mb": local_bytes(optimizer_state) / MB,
        "teacher_mb": sum(p.nbytes for p in distiller.teacher.model.parameters()) / MB,
        "rss_before_steps_mb": resident_at_start,
        "peak_rss_in_steps_mb": resident_mb("VmHWM"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds_per_step": seconds,
    }
    result["student_state_mb"] = result["parameters_mb"] + result["gradients_mb"] + result["optimizer_mb"]
    Path(args.results, f"{args.mode}_{result['rank']}.json").write_text(json.dumps(result))
    state.run.release()


def launch(mode: str, args, results: str) -> list[dict]:
    out_dir = tempfile.mkdtemp(prefix=f"bench-fsdp-{mode}-")
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.processes), "--master_port",
               str(29500 + (os.getpid() % 1000)), __file__, "--worker", mode, "--steps", str(args.steps),
               "--new-tokens", str(args.new_tokens), "--out-dir", out_dir, "--results", results]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    return [json.loads(Path(results, f"{mode}_{rank}.json").read_text()) for rank in range(args.processes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "fsdp.json")
    parser.add_argument("--worker", choices=["ddp", "fsdp"], help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", help=argparse.SUPPRESS)
    parser.add_argument("--results", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.mode = args.worker
        worker(args)
        return

    results = tempfile.mkdtemp(prefix="bench-fsdp-results-")
    rows = {mode: launch(mode, args, results) for mode in ("ddp", "fsdp")}
    columns = ("parameters_mb", "gradients_mb", "optimizer_mb", "student_state_mb", "teacher_mb", "rss_before_steps_mb",
               "peak_rss_in_steps_mb", "peak_rss_mb")
    print(f"{args.processes} processes, CPU (gloo), default pair, {args.steps} steps, {args.new_tokens} new tokens; "
          "MB per process (the mean over processes)")
    print(f"{'':>5} " + " ".join(f"{c.removesuffix('_mb'):>20}" for c in columns) + f" {'s/step':>8}")
    summary = {}
    for mode, ranks in rows.items():
        means = {c: sum(r[c] for r in ranks) / len(ranks) for c in (*columns, "seconds_per_step")}
        summary[mode] = means
        print(f"{mode:>5} " + " ".join(f"{means[c]:>20.0f}" for c in columns) + f" {means['seconds_per_step']:>8.1f}")
    ratios = {c: summary["fsdp"][c] / summary["ddp"][c] for c in columns if summary["ddp"][c]}
    print("fsdp / ddp: " + ", ".join(f"{c.removesuffix('_mb')} {v:.2f}" for c, v in ratios.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, {"machine": platform.machine(), "processes": args.processes, "steps": args.steps,
                            "new_tokens": args.new_tokens, "per_process_mean": summary, "fsdp_over_ddp": ratios,
                            "runs": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
