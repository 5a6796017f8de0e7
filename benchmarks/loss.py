"""Forward+backward time and peak memory of the distillation loss: dense vs chunked, from hidden states.

Shapes default to SmolLM2-135M (V = 49152, H = 576). Each (implementation, N, beta) runs in a fresh process
so peak resident memory is its own; the implementations alternate within each (N, beta) so that drifting
machine load hits both. Reported: median seconds of forward+backward (projection to logits included) and
peak extra resident memory above the inputs. "trl" is the reference library's chunked kernel (TRL 1.16.0's
`ChunkedDivergenceFunction`, through its `_chunked_divergence_loss`, on CPU its torch path), when trl is
installed (`pip install -e ".[trl]"`); "liger" is Liger-Kernel's `LigerFusedLinearJSDLoss` (soft loss only,
its mean over tokens, the same work), on CUDA when liger-kernel is installed; in bf16 it computes the divergence
in bf16, where distill and TRL upcast to float32, so its recorded loss (made a sum) can differ from the others'
by about 0.5%. The summary gives each chunked implementation's reverse-KL
(beta 1) time over its forward-KL (beta 0) time.

    python benchmarks/loss.py                       # the full table (several minutes on 2 cores)
    python benchmarks/loss.py --n 1024 --beta 0.5   # one cell
    python benchmarks/loss.py --device cuda --dtype bfloat16 --n 8192   # the GPU check (benchmarks/gpu.sh)

On CUDA the time is between synchronizations and the memory is the peak of torch's allocations above the inputs.
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

from provenance import write_result  # a sibling script: the result with its environment

IMPLEMENTATIONS = ("dense", "chunked", "trl", "liger")
DTYPES = ("float32", "bfloat16")


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def worker(impl: str, n: int, beta: float, vocab: int, hidden: int, repeats: int, chunk_size: int, seed: int,
           device: str = "cpu", dtype: str = "float32") -> dict:
    import torch

    from distill.losses import chunked_generalized_jsd, generalized_jsd_loss

    torch.manual_seed(seed)
    on_gpu = torch.device(device).type == "cuda"
    floats = {"device": device, "dtype": getattr(torch, dtype)}
    student_hidden = torch.randn(n, hidden, **floats).requires_grad_()
    student_head = (torch.randn(vocab, hidden, **floats) * 0.05).requires_grad_()
    teacher_hidden = torch.randn(n, hidden, **floats)
    teacher_head = torch.randn(vocab, hidden, **floats) * 0.05
    mask = torch.ones(n, dtype=torch.bool, device=device)
    if impl == "liger":
        from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

        # soft loss only; Liger divides its sum by the unmasked tokens, so n labels give the sum's gradient / n
        liger = LigerFusedLinearJSDLoss(weight_hard_loss=0.0, weight_soft_loss=1.0, beta=beta)
        labels = torch.zeros(n, dtype=torch.long, device=device)

    def step() -> float:
        student_hidden.grad = None
        student_head.grad = None
        if impl == "dense":
            with torch.no_grad():
                teacher_logits = teacher_hidden @ teacher_head.T
            student_logits = student_hidden @ student_head.T
            loss = generalized_jsd_loss(student_logits, teacher_logits, beta=beta, reduction="sum")
        elif impl == "trl":  # its loss is sum / num_items_in_batch: n items gives the sum's gradient / n
            from trl.trainer.distillation_trainer import _chunked_divergence_loss

            loss = _chunked_divergence_loss(student_hidden[None], teacher_hidden[None], student_head, teacher_head,
                                            mask[None], beta, num_items_in_batch=1)[0]
        elif impl == "liger":  # its mean; the recorded value is made a sum like the others' below
            loss = liger(student_hidden, student_head, teacher_hidden, teacher_head, labels)
        else:
            loss = chunked_generalized_jsd(
                student_hidden, student_head, teacher_hidden, teacher_head, mask, beta=beta, chunk_size=chunk_size
            ).loss_sum
        loss.backward()
        value = loss.item()  # on CUDA also the synchronization that ends the timed span
        return value * n if impl == "liger" else value

    if on_gpu:
        step()  # kernel compilation and autotuning (Liger, TRL) happen once per process: not timed
        student_hidden.grad = student_head.grad = None  # the baseline is the inputs alone, as on CPU
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = _peak_rss_bytes()
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = step()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if on_gpu else _peak_rss_bytes()
    return {
        "impl": impl,
        "n": n,
        "beta": beta,
        "seconds": statistics.median(times),
        "seconds_all": times,
        "peak_extra_mb": (peak - baseline) / 2**20,
        "loss": value,
    }


def run_in_fresh_process(args: argparse.Namespace, impl: str, n: int, beta: float) -> dict | None:
    command = [
        sys.executable, __file__, "--worker", impl, "--n", str(n), "--beta", str(beta), "--vocab", str(args.vocab),
        "--hidden", str(args.hidden), "--repeats", str(args.repeats), "--chunk-size", str(args.chunk_size),
        "--device", args.device, "--dtype", args.dtype,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if impl in ("dense", "chunked"):
            raise RuntimeError(f"the {impl} worker failed:\n{done.stderr[-3000:]}")
        # a compared library that does not run here (a version mismatch on the GPU machine, say) costs its column only
        print(f"{impl} failed at N={n} beta={beta}, left out:\n{done.stderr[-1500:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def available(device: str) -> tuple[str, ...]:
    """dense and chunked always; trl where it is installed; liger where it is installed and the device is CUDA."""
    import importlib.util

    def runs(impl: str) -> bool:
        if impl == "trl":
            return importlib.util.find_spec("trl") is not None
        if impl == "liger":
            return device.startswith("cuda") and importlib.util.find_spec("liger_kernel") is not None
        return True

    return tuple(impl for impl in IMPLEMENTATIONS if runs(impl))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096], help="completion tokens per step")
    parser.add_argument("--beta", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--repeats", type=int, default=3, help="timed forward+backward runs per process (median)")
    parser.add_argument("--chunk-size", type=int, default=None, help="default: the library's DEFAULT_CHUNK_SIZE")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--dtype", default="float32", choices=DTYPES, help="of the hidden states and heads")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "loss.json")
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chunk_size is None:
        from distill.losses import DEFAULT_CHUNK_SIZE

        args.chunk_size = DEFAULT_CHUNK_SIZE

    if args.worker:
        result = worker(args.worker, args.n[0], args.beta[0], args.vocab, args.hidden, args.repeats, args.chunk_size, seed=0,
                        device=args.device, dtype=args.dtype)
        print(json.dumps(result))
        return

    rows, impls = [], available(args.device)
    print(f"V={args.vocab} H={args.hidden} {args.dtype} {args.device} cpus={os.cpu_count()} chunk_size={args.chunk_size} "
          f"implementations={impls}")
    print(f"{'N':>6} {'beta':>5} {'impl':>8} {'median s':>9} {'peak extra MB':>14} {'time ratio':>11} {'mem ratio':>10}")
    for n in args.n:
        for beta in args.beta:
            pair = {impl: run_in_fresh_process(args, impl, n, beta) for impl in impls}
            dense = pair["dense"]
            if dense is None:
                raise SystemExit(f"the dense loss failed at N={n}, beta={beta}: nothing to compare against")
            for impl in impls:
                r = pair[impl]
                if r is None:
                    continue
                r["time_ratio_vs_dense"] = r["seconds"] / dense["seconds"]
                r["memory_ratio_vs_dense"] = r["peak_extra_mb"] / dense["peak_extra_mb"]
                rows.append(r)
                print(
                    f"{n:>6} {beta:>5} {impl:>8} {r['seconds']:>9.3f} {r['peak_extra_mb']:>14.0f} "
                    f"{r['time_ratio_vs_dense']:>11.2f} {r['memory_ratio_vs_dense']:>10.3f}",
                    flush=True,
                )
    summary = reverse_over_forward(rows)
    for (impl, n), ratio in summary.items():
        print(f"{impl} N={n}: reverse KL (beta 1) takes {ratio:.2f}x the forward KL (beta 0) time")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"vocab": args.vocab, "hidden": args.hidden, "chunk_size": args.chunk_size, "repeats": args.repeats,
            "device": args.device, "dtype": args.dtype, "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version()}
    write_result(args.out, {"meta": meta, "rows": rows, "reverse_over_forward": {
        f"{impl} N={n}": ratio for (impl, n), ratio in summary.items()}})
    print(f"wrote {args.out}")


def reverse_over_forward(rows: list[dict]) -> dict[tuple[str, int], float]:
    """Each chunked implementation's beta-1 median time over its beta-0 one, per N (where both ran)."""
    times = {(r["impl"], r["n"], r["beta"]): r["seconds"] for r in rows}
    return {(impl, n): times[(impl, n, 1.0)] / times[(impl, n, 0.0)] for impl, n, beta in times
            if impl != "dense" and beta == 0.0 and (impl, n, 1.0) in times}


if __name__ == "__main__":
    main()
