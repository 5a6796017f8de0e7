"""Time per optimizer step of the default recipe, split into generation / teacher forward / student
forward+backward, with tokens/s and peak memory; optionally against the reference library.

    python benchmarks/step.py                 # distill's default recipe (gkd), its step-time breakdown
    python benchmarks/step.py --vs-trl        # + TRL's DistillationTrainer on the same models, prompts and
                                              #   settings (always on-policy there, so both run on-policy)
    python benchmarks/step.py --device cuda --dtype bfloat16 --steps 20 --teacher DIR
                                              # the GPU check (benchmarks/gpu.sh): another teacher directory,
                                              #   device and training precision; peak GPU memory is reported too

Each measurement runs in a fresh process (so peak resident memory is its own); with --vs-trl the two
implementations alternate, `--rounds` times each, and the table reports medians and our/their ratios.
The first `--warmup` steps of every process are not timed; a process reports its mean step time (with
seq_kd the teacher samples every `seq_kd_generation_steps` steps, so keep `--steps` a multiple of it). Writes benchmarks/results/step.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_device_mb() -> float | None:
    """Peak memory torch allocated on the GPU in this process, or None on CPU."""
    import torch

    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def _resolved_dtype(args) -> str:
    """`--dtype auto` as distill resolves it (bf16 on a CUDA device that supports it, else float32), so that
    TRL's trainer gets the same precision."""
    import torch

    from distill.training.runtime import mixed_precision

    if args.dtype != "auto":
        return args.dtype
    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    return "bfloat16" if mixed_precision("auto", "cuda" if cuda else "cpu") == "bf16" else "float32"


def _teacher(args) -> str:
    from distill import DistillConfig

    return args.teacher or DistillConfig().teacher


def run_distill(args) -> dict:
    from distill import DistillConfig
    from distill.training.runtime import phase_clock
    from distill.training.trainer import Distiller

    overrides = dict(max_steps=args.warmup + args.steps, eval_before_after=False, progress_bar=False, save_steps=0,
                     logging_steps=1, output_dir=tempfile.mkdtemp(prefix="bench-step-"), overwrite_output_dir=True,
                     teacher=_teacher(args), device=args.device, dtype=args.dtype)
    if args.mode == "on_policy":  # the settings TRL's trainer gets too
        overrides.update(method="on_policy", beta=args.beta, per_device_train_batch_size=args.batch,
                         gradient_accumulation_steps=1, max_new_tokens=args.new_tokens, learning_rate=1e-4)
    if args.vllm:  # a vLLM replica per model in the training process
        overrides.update(generation_engine="vllm", vllm_kv_cache_gib=args.vllm_kv_cache_gib)
    distiller = Distiller(DistillConfig(**overrides))
    distiller.setup()
    step_times, parts = [], {"generation": 0.0, "teacher": 0.0, "student": 0.0}
    tokens = 0
    for step in range(args.warmup + args.steps):
        timings: dict[str, float] = {}
        window = distiller._new_window()
        start = phase_clock(distiller.parts.device)  # on CUDA, after the queued work: each step counts its own kernels
        distiller.train_step(step, window, timings, log_step=False)
        elapsed = phase_clock(distiller.parts.device) - start
        if step >= args.warmup:
            step_times.append(elapsed)
            parts["generation"] += timings.get("generation_student", 0.0) + timings.get("generation_teacher", 0.0)
            parts["teacher"] += timings.get("teacher", 0.0)
            parts["student"] += timings.get("student", 0.0)
            tokens += int(timings.get("tokens_scored", 0))
    return {"impl": "distill", "seconds_per_step": statistics.fmean(step_times), "step_times": step_times,
            "parts_per_step": {k: v / args.steps for k, v in parts.items()}, "completion_tokens_per_second": tokens / sum(step_times),
            "peak_rss_mb": _peak_rss_mb(), "peak_device_mb": _peak_device_mb()}


def run_trl(args) -> dict:
    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import DistillationConfig, DistillationTrainer

    from distill.config import DistillConfig
    from distill.data_files import load_dataset_spec
    from distill.models import (
        load_causal_lm,
        load_tokenizer,
        make_student,
        resolve_model_source,
    )
    from distill.training.runtime import phase_clock

    source = resolve_model_source(_teacher(args), "teacher")
    teacher = load_causal_lm(source, torch.float32)
    tokenizer = load_tokenizer(source)
    student = make_student(teacher, DistillConfig().resolved_student_init(False))
    gpu = args.device != "cpu" and torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if gpu and args.dtype == "bfloat16":  # as distill holds its teacher on a GPU under bf16 autocast
        teacher = teacher.to(torch.bfloat16)
    prompts = load_dataset_spec("bundled", "train", "dataset")
    dataset = datasets.Dataset.from_list([{"prompt": m} for m in prompts["messages"]])

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []
            self.start = 0.0

        def on_step_begin(self, *a, **k):
            self.start = phase_clock(device)

        def on_step_end(self, *a, **k):  # before the trainer's own synchronization: the optimizer may still be queued
            self.times.append(phase_clock(device) - self.start)

    timer = StepTimer()
    config = DistillationConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), per_device_train_batch_size=args.batch, gradient_accumulation_steps=1,
        max_completion_length=args.new_tokens, max_steps=args.warmup + args.steps, beta=args.beta, learning_rate=1e-4,
        use_cpu=not gpu, report_to="none", logging_steps=1, save_strategy="no",
        gradient_checkpointing=False, bf16=args.dtype == "bfloat16",
        temperature=1.0, seed=42,
        **(dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=args.trl_vllm_memory) if args.vllm else {}),
    )
    trainer = DistillationTrainer(model=student, teacher_model=teacher, args=config, train_dataset=dataset,
                                  processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    times = timer.times[args.warmup:]
    return {"impl": "trl", "seconds_per_step": statistics.fmean(times), "step_times": times, "peak_rss_mb": _peak_rss_mb(),
            "peak_device_mb": _peak_device_mb()}


def fresh_process(args, impl: str) -> dict | None:
    """One worker's result; None when TRL's fails (its column is left out, distill's numbers stand)."""
    command = [sys.executable, __file__, "--worker", impl, "--mode", args.mode, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--new-tokens", str(args.new_tokens), "--beta", str(args.beta),
               "--device", args.device, "--dtype", args.dtype] + (["--teacher", args.teacher] if args.teacher else []) \
        + (["--vllm", "--vllm-kv-cache-gib", str(args.vllm_kv_cache_gib), "--trl-vllm-memory", str(args.trl_vllm_memory)]
           if args.vllm else [])
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        if impl == "distill":
            raise RuntimeError(f"the distill worker failed:\n{done.stderr[-3000:]}")
        print(f"{impl} failed, left out:\n{done.stderr[-1500:]}", flush=True)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vs-trl", action="store_true", help="also run TRL's DistillationTrainer (needs `pip install trl`)")
    parser.add_argument("--mode", choices=["default", "on_policy"], default=None,
                        help="distill's recipe: the default (gkd) or on_policy (always, with --vs-trl)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per process")
    parser.add_argument("--rounds", type=int, default=2, help="with --vs-trl: processes per implementation, alternating")
    parser.add_argument("--batch", type=int, default=4, help="on_policy mode: prompts per step (the default recipe keeps its own)")
    parser.add_argument("--new-tokens", type=int, default=64, help="on_policy mode: completion length")
    parser.add_argument("--beta", type=float, default=0.5, help="on_policy mode: loss beta")
    parser.add_argument("--device", default="auto", help="distill's `device` ('auto': CUDA when present, else CPU)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="distill's `dtype` (TRL: bf16 "
                        "for bfloat16, else float32)")
    parser.add_argument("--teacher", default=None, help="distill's `teacher` (default: the bundled default teacher)")
    parser.add_argument("--vllm", action="store_true", help="both sample with vLLM colocated in the training process "
                        "(distill: generation_engine vllm; TRL: use_vllm, vllm_mode colocate)")
    parser.add_argument("--vllm-kv-cache-gib", type=float, default=4.0, help="with --vllm: distill's vllm_kv_cache_gib")
    parser.add_argument("--trl-vllm-memory", type=float, default=0.3, help="with --vllm: TRL's vllm_gpu_memory_utilization")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "step.json")
    parser.add_argument("--worker", choices=["distill", "trl"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.mode = args.mode or ("on_policy" if args.vs_trl else "default")
    args.dtype = _resolved_dtype(args)

    if args.worker:
        result = run_distill(args) if args.worker == "distill" else run_trl(args)
        print(json.dumps(result))
        return

    if args.vs_trl and args.mode != "on_policy":
        parser.error("--vs-trl compares on-policy training (TRL's DistillationTrainer always samples from the student)")
    impls = ["distill", "trl"] if args.vs_trl else ["distill"]
    results: dict[str, list[dict]] = {impl: [] for impl in impls}
    for _ in range(args.rounds if args.vs_trl else 1):
        for impl in impls:
            measured = fresh_process(args, impl)
            if measured is not None:
                results[impl].append(measured)
                print(f"{impl}: {measured['seconds_per_step']:.2f} s/step", flush=True)

    ours = results["distill"]
    median = lambda rows, key: statistics.median(r[key] for r in rows)  # noqa: E731
    settings = f"batch {args.batch}, {args.new_tokens} new tokens" if args.mode == "on_policy" else "the default recipe's settings"
    device = "CUDA" if ours[0].get("peak_device_mb") is not None else "CPU"
    print(f"\nmode {args.mode}, {settings}, {device}, dtype {args.dtype}")
    print(f"{'impl':>8} {'s/step':>8} {'generation':>11} {'teacher':>8} {'student f+b':>12} {'tok/s':>7} {'peak MB':>8}")
    parts = {k: statistics.median(r["parts_per_step"][k] for r in ours) for k in ("generation", "teacher", "student")}
    print(f"{'distill':>8} {median(ours, 'seconds_per_step'):>8.2f} {parts['generation']:>11.2f} {parts['teacher']:>8.2f} "
          f"{parts['student']:>12.2f} {median(ours, 'completion_tokens_per_second'):>7.0f} {median(ours, 'peak_rss_mb'):>8.0f}")
    if device == "CUDA":
        print(f"peak GPU memory (torch's allocations): distill {median(ours, 'peak_device_mb'):.0f} MB")
    summary = {"mode": args.mode, "settings": settings, "machine": platform.machine(), "device": device, "dtype": args.dtype,
               "teacher": _teacher(args),
               "distill": {"seconds_per_step": median(ours, "seconds_per_step"), "parts_per_step": parts,
                           "completion_tokens_per_second": median(ours, "completion_tokens_per_second"),
                           "peak_rss_mb": median(ours, "peak_rss_mb"),
                           "peak_device_mb": median(ours, "peak_device_mb") if device == "CUDA" else None},
               "runs": results}
    if args.vs_trl and results["trl"]:
        theirs = results["trl"]
        print(f"{'trl':>8} {median(theirs, 'seconds_per_step'):>8.2f} {'':>11} {'':>8} {'':>12} {'':>7} {median(theirs, 'peak_rss_mb'):>8.0f}")
        memory = "peak_device_mb" if device == "CUDA" else "peak_rss_mb"  # on a GPU, the memory that matters is the GPU's
        if device == "CUDA":
            print(f"peak GPU memory (torch's allocations): trl {median(theirs, memory):.0f} MB")
        ratio_time = median(ours, "seconds_per_step") / median(theirs, "seconds_per_step")
        ratio_memory = median(ours, memory) / median(theirs, memory)
        print(f"ours / theirs: time {ratio_time:.2f}, peak {'GPU' if device == 'CUDA' else 'resident'} memory {ratio_memory:.2f}")
        summary["trl"] = {"seconds_per_step": median(theirs, "seconds_per_step"), "peak_rss_mb": median(theirs, "peak_rss_mb"),
                          "peak_device_mb": median(theirs, "peak_device_mb") if device == "CUDA" else None}
        summary["ratios"] = {"time": ratio_time, "peak_memory": ratio_memory}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, summary)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
