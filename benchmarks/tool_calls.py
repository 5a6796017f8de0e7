"""What running a tool call in a worker process costs, against running it on a thread of the trainer (as distill did
before tools moved to workers).

Measured with a warm pool (the workers started before the clock runs), on a tool that returns at once
(`distill.tasks.lookup:lookup_code`), so what is timed is the overhead: sending the call, the worker running it and
sending the text back, against starting a thread and joining it. Three shapes:

- one call at a time (a conversation's single call per round);
- a round of 8 calls at once over 4 workers (what the tool-call loop does with 8 rows), per call;
- the same through `ToolCalls` (the loop's own path: a call routed by name, its result a `ToolResult`);

and, once, a worker's start: what the first call of a run (or the first after a timeout killed a worker) waits for.
The baseline is a minimal copy of the former runner: a daemon thread per call, joined with the timeout.

    python benchmarks/tool_calls.py [--calls 2000]
Prints a table; writes benchmarks/results/tool_calls.json (with `provenance`: the versions and the commit).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from provenance import write_result

from distill.callables import import_callable
from distill.conversations.calls import ToolCalls
from distill.conversations.tool_calls import ToolCall
from distill.conversations.tools import load_tools
from distill.conversations.workers import Job, WorkerPool

TOOL = "distill.tasks.lookup:lookup_code"
ARGUMENTS = {"name": "Balbrenia"}
ROUND = 8
WORKERS = 4
TIMEOUT = 10.0


def thread_round(function, calls: int) -> None:
    """The former runner: each call on a daemon thread of its own, all started at once, each joined."""
    slots: list[dict] = [{} for _ in range(calls)]

    def run(slot: dict) -> None:
        slot["value"] = function(**ARGUMENTS)

    threads = [threading.Thread(target=run, args=(slot,), daemon=True) for slot in slots]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert all("value" in slot for slot in slots)


def per_call_ms(run_round, rounds: int, calls_per_round: int, repeats: int = 5) -> float:
    """Median over `repeats` of the milliseconds per call of `rounds` rounds."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(rounds):
            run_round()
        samples.append((time.perf_counter() - start) * 1e3 / (rounds * calls_per_round))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls per measurement (each repeated 5 times)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "tool_calls.json")
    args = parser.parse_args()
    function = import_callable(TOOL, "tools")

    single = WorkerPool(0, 1, preload=((TOOL, "tools"),))
    wide = WorkerPool(0, WORKERS, preload=((TOOL, "tools"),))
    calls = ToolCalls(load_tools([TOOL]), None, TIMEOUT, WORKERS)
    job = Job(("call", TOOL, ARGUMENTS))
    batch = [(row, ToolCall("lookup_code", ARGUMENTS)) for row in range(ROUND)]
    conversations = calls.open([{}] * ROUND, list(range(ROUND)))
    try:
        start = time.perf_counter()
        single.run([job], TIMEOUT)
        cold_ms = (time.perf_counter() - start) * 1e3
        wide.run([job] * ROUND, TIMEOUT)  # warm: every worker started
        conversations.run(batch)
        assert single.run([job], TIMEOUT)[0].failure is None
        rounds = max(args.calls // ROUND, 1)
        rows: list[dict[str, Any]] = [
            {"shape": "one call at a time", "thread_ms": per_call_ms(lambda: thread_round(function, 1), args.calls, 1),
             "worker_ms": per_call_ms(lambda: single.run([job], TIMEOUT), args.calls, 1)},
            {"shape": f"{ROUND} calls at once, {WORKERS} workers",
             "thread_ms": per_call_ms(lambda: thread_round(function, ROUND), rounds, ROUND),
             "worker_ms": per_call_ms(lambda: wide.run([job] * ROUND, TIMEOUT), rounds, ROUND)},
            {"shape": f"{ROUND} calls at once through ToolCalls",
             "thread_ms": per_call_ms(lambda: thread_round(function, ROUND), rounds, ROUND),
             "worker_ms": per_call_ms(lambda: conversations.run(batch), rounds, ROUND)},
        ]
    finally:
        conversations.close()
        for pool in (single, wide, calls.pool):
            pool.close()
    for row in rows:
        row["overhead_ms"] = row["worker_ms"] - row["thread_ms"]
    print(f"{'shape':<40} {'thread ms/call':>15} {'worker ms/call':>15} {'added ms/call':>14}")
    for row in rows:
        print(f"{row['shape']:<40} {row['thread_ms']:>15.3f} {row['worker_ms']:>15.3f} {row['overhead_ms']:>14.3f}")
    print(f"a worker's start (its first call): {cold_ms:.0f} ms")
    write_result(args.out, {"tool": TOOL, "calls": args.calls, "rows": rows, "worker_start_ms": cold_ms,
                            "aim_ms_per_call": 5.0})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
