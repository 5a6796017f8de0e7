"""Forward+backward time and peak memory of the distillation loss: dense vs chunked, from hidden states.

Shapes default to SmolLM2-135M (V = 49152, H = 576). Each (implementation, N, beta) runs in a fresh process
so peak resident memory is its own; the implementations alternate within each (N, beta) so that drifting
machine load hits both. Reported: median seconds of forward+backward (projection to logits included) and
peak extra resident memory above the inputs.

    python benchmarks/loss.py                       # the full table (several minutes on 2 cores)
    python benchmarks/loss.py --n 1024 --beta 0.5   # one cell
Writes benchmarks/results/loss.json (override with --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMPLEMENTATIONS = ("dense", "chunked")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def worker(impl: str, n: int, beta: float, vocab: int, hidden: int, repeats: int, chunk_size: int, seed: int) -> dict:
    import torch

    from distill.losses import chunked_generalized_jsd, generalized_jsd_loss

    torch.manual_seed(seed)
    student_hidden = torch.randn(n, hidden, requires_grad=True)
    student_head = (torch.randn(vocab, hidden) * 0.05).requires_grad_()
    teacher_hidden = torch.randn(n, hidden)
    teacher_head = torch.randn(vocab, hidden) * 0.05
    mask = torch.ones(n, dtype=torch.bool)

    def step() -> float:
        student_hidden.grad = None
        student_head.grad = None
        if impl == "dense":
            with torch.no_grad():
                teacher_logits = teacher_hidden @ teacher_head.T
            student_logits = student_hidden @ student_head.T
            loss = generalized_jsd_loss(student_logits, teacher_logits, beta=beta, reduction="sum")
        else:
            loss = chunked_generalized_jsd(
                student_hidden, student_head, teacher_hidden, teacher_head, mask, beta=beta, chunk_size=chunk_size
            ).loss_sum
        loss.backward()
        return loss.item()

    baseline = _peak_rss_bytes()
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = step()
        times.append(time.perf_counter() - start)
    return {
        "impl": impl,
        "n": n,
        "beta": beta,
        "seconds": statistics.median(times),
        "seconds_all": times,
        "peak_extra_mb": (_peak_rss_bytes() - baseline) / 2**20,
        "loss": value,
    }


def run_in_fresh_process(args: argparse.Namespace, impl: str, n: int, beta: float) -> dict:
    command = [
        sys.executable, __file__, "--worker", impl, "--n", str(n), "--beta", str(beta), "--vocab", str(args.vocab),
        "--hidden", str(args.hidden), "--repeats", str(args.repeats), "--chunk-size", str(args.chunk_size),
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096], help="completion tokens per step")
    parser.add_argument("--beta", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--repeats", type=int, default=3, help="timed forward+backward runs per process (median)")
    parser.add_argument("--chunk-size", type=int, default=None, help="default: the library's DEFAULT_CHUNK_SIZE")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "loss.json")
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chunk_size is None:
        from distill.losses import DEFAULT_CHUNK_SIZE

        args.chunk_size = DEFAULT_CHUNK_SIZE

    if args.worker:
        result = worker(args.worker, args.n[0], args.beta[0], args.vocab, args.hidden, args.repeats, args.chunk_size, seed=0)
        print(json.dumps(result))
        return

    rows = []
    print(f"V={args.vocab} H={args.hidden} fp32 CPU threads={os.cpu_count()} chunk_size={args.chunk_size}")
    print(f"{'N':>6} {'beta':>5} {'impl':>8} {'median s':>9} {'peak extra MB':>14} {'time ratio':>11} {'mem ratio':>10}")
    for n in args.n:
        for beta in args.beta:
            pair = {impl: run_in_fresh_process(args, impl, n, beta) for impl in IMPLEMENTATIONS}
            for impl in IMPLEMENTATIONS:
                r = pair[impl]
                r["time_ratio_vs_dense"] = r["seconds"] / pair["dense"]["seconds"]
                r["memory_ratio_vs_dense"] = r["peak_extra_mb"] / pair["dense"]["peak_extra_mb"]
                rows.append(r)
                print(
                    f"{n:>6} {beta:>5} {impl:>8} {r['seconds']:>9.3f} {r['peak_extra_mb']:>14.0f} "
                    f"{r['time_ratio_vs_dense']:>11.2f} {r['memory_ratio_vs_dense']:>10.3f}",
                    flush=True,
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"vocab": args.vocab, "hidden": args.hidden, "chunk_size": args.chunk_size, "repeats": args.repeats,
            "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
