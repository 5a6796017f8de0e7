"""The hidden-state teacher payload against top-K log-probs: bytes per token, the error of rounded states, the
step time of every teacher location side by side, and (`--outcome`) what exactness buys in training.

    python benchmarks/hidden.py                      # SmolLM2-135M-Instruct teacher, CPU; about 15 minutes
    python benchmarks/hidden.py --outcome            # + the offline recipe from both caches; about 22 minutes

1. Data: the first `--examples` bundled prompts; the teacher samples their completions once
   (`cache-teacher --generate`), which become a dataset's completions, so every cache and every run below
   holds the same tokens.
2. Caches of those completions: top-K log-probs (K = `--k`), and the hidden states in float32, bfloat16 and
   int8: bytes per token on disk and in the per-token arrays, next to full logits (2V bytes in bfloat16).
3. Error of the rounded states: per completion token, KL(exact || rounded) between the teacher's distribution
   from the float32 states and from the bfloat16 / int8 ones (the same head), mean and max over all tokens.
4. Step time of gkd (off-policy on those completions, batch 4 x 2, the default student) with the teacher
   as a local model, a `serve-teacher` giving hidden states, the hidden-state caches, a top-K server and a
   top-K cache; each in a fresh process, the first step untimed, the arms alternating `--rounds` times (3:
   the median then sets one slow run aside, which a median of 2 cannot).
5. `--outcome`: the offline recipe (teacher samples, forward KL; its student is the teacher minus every third
   layer) from the top-K cache and from the bfloat16 hidden-state cache at equal steps (`--outcome-steps`,
   every bundled training prompt); then `distill eval`
   of both with the local teacher: held-out forward KL on the teacher's completions, over the full vocabulary.
Writes benchmarks/results/hidden.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from provenance import write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).parent))
from teacher import TEACHER, _free_port, make_data_and_student, timed_steps  # noqa: E402

HIDDEN_DTYPES = ("float32", "bfloat16", "int8")


def _cache(work: Path, data: Path, out: str, generate: bool = False, k: int | None = None, dtype: str | None = None,
           new_tokens: int = 48) -> dict:
    from distill.commands.cache_teacher import CacheJob, run_cache_teacher

    job = CacheJob(TEACHER, None, None, str(data), "train", k, str(work / out), temperature=1.0 if k else None, generate=generate,
                   max_new_tokens=new_tokens, shard_size=64, batch_size=16, progress=False, device="cpu",
                   payload="topk" if k else "hidden", hidden_dtype=dtype or "float32")
    return run_cache_teacher(job)


def with_completions(work: Path, prompts: Path, generated: str) -> Path:
    """The prompts with the teacher's sampled completions (decoded) as a dataset's completions."""
    from distill.models import load_tokenizer, resolve_model_source
    from distill.teachers.cache import TeacherCache

    tokenizer = load_tokenizer(resolve_model_source(str(work / "student"), "student"))
    cached = TeacherCache(work / generated)
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    for index, row in enumerate(rows):
        row["completion"] = tokenizer.decode(cached.get(index).tokens.tolist(), skip_special_tokens=True)
    path = work / f"{prompts.stem}_with_completions.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    return path


def rounding_error(work: Path) -> dict:
    """KL(exact || rounded) per token, from the float32 cache's states and the rounded caches' (same head)."""
    import torch

    from distill.teachers.cache import TeacherCache
    from distill.teachers.cache.reader import CachedHidden

    def hidden_states(cache: TeacherCache, example_id: int) -> torch.Tensor:
        cached = cache.get(example_id)
        assert isinstance(cached, CachedHidden), f"{cache.directory}: a hidden-payload cache"
        return cached.hidden

    exact = TeacherCache(work / "hidden-float32")
    head = exact.head
    assert head is not None, "a hidden-payload cache stores its teacher's head"
    result = {}
    for dtype in HIDDEN_DTYPES[1:]:
        rounded = TeacherCache(work / f"hidden-{dtype}")
        kls = []
        for example_id in sorted(exact.location):
            p = head.full_logits(hidden_states(exact, example_id)).log_softmax(-1).double()
            q = head.full_logits(hidden_states(rounded, example_id)).log_softmax(-1).double()
            kls.append((p.exp() * (p - q)).sum(-1))
        kl = torch.cat(kls)
        result[dtype] = {"tokens": kl.numel(), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
                         "kl_p99": float(kl.quantile(0.99))}
        print(f"  {dtype}: KL(exact || rounded) mean {kl.mean():.2e}, p99 {kl.quantile(0.99):.2e}, max {kl.max():.2e} "
              f"over {kl.numel()} tokens", flush=True)
    return result


ARMS = ("local", "hidden server", "hidden cache float32", "hidden cache bfloat16", "top-k server", "top-k cache")


def step_child(arm: str, work: Path, steps: int, k: int, url: str) -> dict:
    """Runs in its own process: mean step time and peak RSS of one arm."""
    from distill import DistillConfig
    from distill.training.trainer import Distiller

    common = dict(method="gkd", student=str(work / "student"), lmbda=0.0, lmbda_schedule="constant", seq_kd=False,
                  eval_before_after=False, progress_bar=False, save_steps=0, logging_steps=1, max_steps=steps + 1,
                  max_new_tokens=48, output_dir=str(work / f"run-{arm.replace(' ', '-')}"), overwrite_output_dir=True,
                  dataset=str(work / "prompts_with_completions.jsonl"))
    locations: dict[str, dict[str, Any]] = {
                "local": {}, "hidden server": {"teacher_url": url, "teacher_payload": "hidden"},
                "hidden cache float32": {"teacher_cache": str(work / "hidden-float32"), "teacher_payload": "hidden"},
                "hidden cache bfloat16": {"teacher_cache": str(work / "hidden-bfloat16"), "teacher_payload": "hidden"},
                "top-k server": {"teacher_url": url, "teacher_logprobs": k},
                "top-k cache": {"teacher_cache": str(work / "topk"), "teacher_logprobs": k}}
    return {"arm": arm, **timed_steps(Distiller(DistillConfig(**common, **locations[arm])), steps)}


def step_times(args, work: Path) -> dict:
    from distill.commands.serve_teacher import wait_until_healthy

    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "distill", "serve-teacher", TEACHER, "--port", str(port), "--device", "cpu",
                               "--max-logprobs", str(args.k)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", 300.0, server)
        for round_ in range(args.rounds):
            for arm in ARMS:
                out = subprocess.run([sys.executable, __file__, "--child", arm, "--work", str(work), "--steps", str(args.steps),
                                      "--k", str(args.k), "--url", f"http://127.0.0.1:{port}"], capture_output=True, text=True)
                if out.returncode:
                    raise RuntimeError(f"{arm}: {out.stderr[-3000:]}")
                result = json.loads(out.stdout.strip().splitlines()[-1])
                runs[arm].append(result)
                print(f"  round {round_ + 1} {arm:>22}: {result['seconds_per_step']:.2f} s/step (teacher "
                      f"{result['teacher_seconds_per_step']:.2f} s), peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)
    finally:
        server.kill()
        server.wait()
    table = {arm: {"seconds_per_step": statistics.median(r["seconds_per_step"] for r in rows),
                   "teacher_seconds_per_step": statistics.median(r["teacher_seconds_per_step"] for r in rows),
                   "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rows)} for arm, rows in runs.items()}
    base = table["top-k cache"]["seconds_per_step"]
    for arm in table:
        table[arm]["vs_topk_cache"] = table[arm]["seconds_per_step"] / base
    return {"arms": table, "runs": runs}


def outcome(args, work: Path) -> dict:
    """The offline recipe from a top-K cache and from a bfloat16 hidden-state cache, at equal steps."""
    from distill.data import examples_from_dataset
    from distill.data_files import load_dataset_spec

    examples = examples_from_dataset(load_dataset_spec("bundled", "train", "dataset"), "dataset")
    prompts = work / "all_prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": e.prompt}, ensure_ascii=False) for e in examples))
    start = time.perf_counter()
    _cache(work, prompts, "all-generated", generate=True, k=args.k)
    data = with_completions(work, prompts, "all-generated")
    _cache(work, data, "all-topk", k=args.k)
    _cache(work, data, "all-hidden-bfloat16", dtype="bfloat16")
    print(f"  caches of {len(examples)} examples in {time.perf_counter() - start:.0f} s", flush=True)
    result = {"examples": len(examples), "steps": args.outcome_steps, "arms": {}}
    for arm, location in (("top-k cache", ["--teacher_cache", str(work / "all-topk"), "--teacher_logprobs", str(args.k)]),
                          ("hidden cache bfloat16", ["--teacher_cache", str(work / "all-hidden-bfloat16"),
                                                     "--teacher_payload", "hidden"])):
        run = work / f"outcome-{arm.replace(' ', '-')}"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "distill", "train", "offline", "--dataset", str(data), *location,
                        "--max_steps", str(args.outcome_steps), "--output_dir", str(run),
                        "--overwrite_output_dir", "true", "--progress_bar", "false", "--save_steps", "0"],
                       check=True, stdout=subprocess.DEVNULL)
        train_seconds = time.perf_counter() - start
        subprocess.run([sys.executable, "-m", "distill", "eval", str(run / "model"), "--teacher", TEACHER, "--dataset", "bundled",
                        "--split", "heldout", "--out", str(run / "eval-full")], check=True, stdout=subprocess.DEVNULL)
        report = json.loads((run / "eval-full" / "eval.json").read_text())
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        curve = [{"step": m["step"], "loss": m.get("loss"), "forward_kl": m.get("forward_kl")} for m in metrics if "loss" in m]
        result["arms"][arm] = {"train_seconds": train_seconds, "eval": report["metrics"], "curve": curve}
        student = report["metrics"]["student"]
        print(f"  {arm}: held-out forward KL on teacher completions {student['on_teacher_completions']['forward_kl']:.3f}, "
              f"on its own {student['on_student_completions']['forward_kl']:.3f} ({train_seconds:.0f} s)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=64)
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per arm")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runs of each arm, alternating; the median of 3 or more sets one slow run aside")
    parser.add_argument("--outcome", action="store_true")
    parser.add_argument("--outcome-steps", type=int, default=40)
    parser.add_argument("--child", choices=ARMS)
    parser.add_argument("--work")
    parser.add_argument("--url")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step_child(args.child, Path(args.work), args.steps, args.k, args.url)))
        return
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench-hidden-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    result = {"machine": platform.machine(), "teacher": TEACHER, "examples": args.examples, "k": args.k}
    prompts, _ = make_data_and_student(argparse.Namespace(examples=args.examples), work)
    print("caches:", flush=True)
    _cache(work, prompts, "generated", generate=True, k=args.k)
    data = with_completions(work, prompts, "generated")
    manifests = {"top-k": _cache(work, data, "topk", k=args.k)}
    for dtype in HIDDEN_DTYPES:
        manifests[f"hidden {dtype}"] = _cache(work, data, f"hidden-{dtype}", dtype=dtype)
    vocab, hidden_size = manifests["hidden float32"]["vocab_size"], manifests["hidden float32"]["hidden_size"]
    result["bytes_per_token"] = {name: {"per_token_arrays": m["token_bytes_per_token"], "files": m["bytes_per_token"]}
                                 for name, m in manifests.items()}
    result["bytes_per_token"]["full logits (bfloat16)"] = {"per_token_arrays": 2 * vocab, "files": None}
    result["vocab_size"], result["hidden_size"], result["tokens"] = vocab, hidden_size, manifests["top-k"]["tokens"]
    head_mb = vocab * hidden_size * 4 / 2**20
    result["head_memory_mb"] = {"this teacher": head_mb, "8B-class (V 128256, H 4096)": 128256 * 4096 * 4 / 2**20}
    for name, sizes in result["bytes_per_token"].items():
        print(f"  {name:>24}: {sizes['per_token_arrays']:.0f} bytes/token", flush=True)
    print("rounding error:", flush=True)
    result["rounding_error"] = rounding_error(work)
    print("step time:", flush=True)
    result["step_time"] = step_times(args, work)
    if args.outcome:
        print("outcome:", flush=True)
        result["outcome"] = outcome(args, work)
    result["wall_minutes"] = (time.perf_counter() - started) / 60
    out = Path(__file__).parent / "results" / "hidden.json"
    write_result(out, result)
    print(f"wrote {out} ({result['wall_minutes']:.1f} minutes; work directory {work})")


if __name__ == "__main__":
    main()
