"""Teachers off the training process: scoring throughput of `distill serve-teacher`, the size of an offline
cache, and the time and memory of a training step from the cache vs with the teacher model in-process.

    python benchmarks/teacher.py                 # SmolLM2-135M-Instruct teacher, CPU
    python benchmarks/teacher.py --examples 64 --k 20 --steps 4

1. Scoring: a real `distill serve-teacher` subprocess on loopback; the same sequences are scored through the
   server teacher client at concurrency 1, 4 and 16 (one sequence per request, so the server's batcher is what
   concurrency feeds). Reported: teacher tokens scored per second (every position of every sequence).
2. Cache: `distill cache-teacher --generate` over the first `--examples` bundled prompts: bytes per token on
   disk and in the per-token arrays.
3. Step: the same student, data and completions, trained by method gkd from the cache (teacher_cache) and by method gkd with
   the local teacher (off-policy, the cached completions as dataset completions); each in a fresh process
   (its own peak RSS); the first step is not timed.
Writes benchmarks/results/teacher.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment

TEACHER = "smollm2-135m-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scoring(args, work: Path) -> list[dict]:
    from distill.commands.serve_teacher import wait_until_healthy
    from distill.data import examples_from_dataset
    from distill.data_files import load_dataset_spec
    from distill.models import load_tokenizer, resolve_model_source
    from distill.rendering import TextRenderer
    from distill.teachers.topk_client import ServerSettings, ServerTeacher

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "distill", "serve-teacher", TEACHER, "--port", str(port), "--device", "cpu",
                               "--max-logprobs", str(max(args.k, 1))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", 300.0, server)
        tokenizer = load_tokenizer(resolve_model_source(TEACHER, "teacher"))
        examples = examples_from_dataset(load_dataset_spec("bundled", "train", "dataset"), "dataset")[: args.sequences * 2]
        encoder = TextRenderer(tokenizer, 256, args.new_tokens, [tokenizer.eos_token_id])
        prompts = [encoder.prompt_ids(e.prompt)[0] for e in examples]
        # A completion-sized continuation: another prompt's tokens (throughput does not depend on the text).
        sequences = [p + prompts[-1 - i][: args.new_tokens] for i, p in enumerate(prompts[: args.sequences])]
        starts = [1] * len(sequences)
        tokens = sum(len(s) - 1 for s in sequences)
        rows = []
        for concurrency in (1, 4, 16):
            teacher = ServerTeacher(ServerSettings(f"http://127.0.0.1:{port}", args.k, concurrency=concurrency, request_size=1), len(tokenizer))
            teacher.prompt_logprobs(sequences[:2], starts[:2], 1.0)  # warm-up
            times = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                teacher.prompt_logprobs(sequences, starts, 1.0)
                times.append(time.perf_counter() - start)
            teacher.close()
            best = min(times)
            rows.append({"concurrency": concurrency, "sequences": len(sequences), "tokens": tokens, "seconds": best,
                         "tokens_per_second": tokens / best})
            print(f"  concurrency {concurrency:>2}: {tokens / best:8.0f} teacher tokens/s ({len(sequences)} sequences, {best:.2f} s)", flush=True)
        return rows
    finally:
        server.kill()
        server.wait()


def make_data_and_student(args, work: Path) -> tuple[Path, Path]:
    import torch

    from distill.data import examples_from_dataset
    from distill.data_files import load_dataset_spec
    from distill.models import (
        load_causal_lm,
        load_tokenizer,
        make_student,
        resolve_model_source,
    )

    examples = examples_from_dataset(load_dataset_spec("bundled", "train", "dataset"), "dataset")[: args.examples]
    data = work / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"messages": e.prompt}, ensure_ascii=False) for e in examples))
    source = resolve_model_source(TEACHER, "teacher")
    student = make_student(load_causal_lm(source, torch.float32), "drop_every:3")
    student.save_pretrained(work / "student")
    load_tokenizer(source).save_pretrained(work / "student")
    return data, work / "student"


def cache(args, work: Path, data: Path) -> dict:
    from distill.commands.cache_teacher import CacheJob, run_cache_teacher

    start = time.perf_counter()
    manifest = run_cache_teacher(CacheJob(TEACHER, None, None, str(data), "train", args.k, str(work / "cache"), generate=True,
                                          max_new_tokens=args.new_tokens, shard_size=64, batch_size=16, progress=False, device="cpu"))
    seconds = time.perf_counter() - start
    row = {"examples": manifest["num_examples"], "tokens": manifest["tokens"], "k": args.k, "bytes_per_token": manifest["bytes_per_token"],
           "token_bytes_per_token": manifest["token_bytes_per_token"], "budget_6k_plus_4": 6 * args.k + 4, "seconds": seconds}
    print(f"  cache: {row['tokens']} tokens, {row['bytes_per_token']:.1f} bytes/token on disk, {row['token_bytes_per_token']:.0f} "
          f"in per-token arrays (budget 6K+4 = {6 * args.k + 4}); written in {seconds:.0f} s (with generation)", flush=True)
    return row


def step_child(mode: str, work: Path, steps: int, k: int, new_tokens: int) -> dict:
    """Runs in its own process: mean step time and peak RSS of one configuration."""
    from distill import DistillConfig
    from distill.training.trainer import Distiller

    common = dict(student=str(work / "student"), lmbda=0.0, lmbda_schedule="constant", seq_kd=False, eval_before_after=False,
                  progress_bar=False, save_steps=0, logging_steps=1, max_steps=steps + 1, max_new_tokens=new_tokens,
                  output_dir=str(work / f"run-{mode}"), overwrite_output_dir=True)
    if mode == "offline":
        config = DistillConfig(method="gkd", teacher_cache=str(work / "cache"), teacher_logprobs=k, dataset=str(work / "prompts.jsonl"), **common)
    else:
        config = DistillConfig(method="gkd", dataset=str(work / "with_completions.jsonl"), **common)
    return {"mode": mode, **timed_steps(Distiller(config), steps)}


def timed_steps(distiller, steps: int) -> dict:
    """Mean time of `steps` optimizer steps after one untimed, its teacher part, and this process's peak RSS."""
    distiller.setup()
    times, teacher = [], 0.0
    for step in range(steps + 1):
        timings: dict[str, float] = {}
        start = time.perf_counter()
        distiller.train_step(step, distiller._new_window(), timings, log_step=False)
        if step:
            times.append(time.perf_counter() - start)
            teacher += timings.get("teacher", 0.0)
    return {"seconds_per_step": sum(times) / len(times), "teacher_seconds_per_step": teacher / len(times),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def steps(args, work: Path, data: Path) -> list[dict]:
    from distill.models import load_tokenizer
    from distill.teachers.cache import TeacherCache

    tokenizer = load_tokenizer(resolve_student(work))
    cached = TeacherCache(work / "cache")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    for index, row in enumerate(rows):
        row["completion"] = tokenizer.decode(cached.get(index).tokens.tolist(), skip_special_tokens=True)
    (work / "with_completions.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    results = []
    for mode in ("offline", "local"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, "--work", str(work), "--steps", str(args.steps),
                              "--k", str(args.k), "--new-tokens", str(args.new_tokens)], capture_output=True, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(result)
        print(f"  {mode:>7}: {result['seconds_per_step']:.2f} s/step (teacher {result['teacher_seconds_per_step']:.2f} s), "
              f"peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)
    return results


def resolve_student(work: Path):
    from distill.models import resolve_model_source

    return resolve_model_source(str(work / "student"), "student")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=32, help="sequences scored per round through the server")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--examples", type=int, default=64, help="examples in the cache and the training runs")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--parts", default="scoring,cache,steps", help="comma-separated subset to (re)measure; the others are "
                        "kept from an existing results file (steps need the cache of the same --work)")
    parser.add_argument("--child", choices=("offline", "local"))
    parser.add_argument("--work")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step_child(args.child, Path(args.work), args.steps, args.k, args.new_tokens)))
        return
    parts = set(args.parts.split(","))
    out = Path(__file__).parent / "results" / "teacher.json"
    result = json.loads(out.read_text()) if out.is_file() and parts != {"scoring", "cache", "steps"} else {}
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-teacher-"))
    result.update({"machine": platform.platform(), "processor": platform.processor(), "teacher": TEACHER})
    if "scoring" in parts:
        print("scoring through serve-teacher:", flush=True)
        result["scoring"] = scoring(args, work)
    if "cache" in parts:
        data, _ = make_data_and_student(args, work)
        print("offline cache:", flush=True)
        result["cache"] = cache(args, work, data)
    if "steps" in parts:
        print("training step (batch 4 x 2 micro-batches, off-policy):", flush=True)
        step_rows = steps(args, work, work / "prompts.jsonl")
        result.update({"steps": step_rows,
                       "offline_over_local_step_time": step_rows[0]["seconds_per_step"] / step_rows[1]["seconds_per_step"],
                       "offline_over_local_peak_rss": step_rows[0]["peak_rss_mb"] / step_rows[1]["peak_rss_mb"]})
        print(f"offline / local: step time {result['offline_over_local_step_time']:.2f}x, peak RSS {result['offline_over_local_peak_rss']:.2f}x")
    write_result(out, result)
    print(f"wrote {out} (work directory {work})")


if __name__ == "__main__":
    main()
