"""`distill serve-teacher` under load: concurrent clients on loopback, latency, correctness, graceful shutdown.

A real `distill serve-teacher` subprocess serves a tiny random Llama (the soak benchmark's models). First
each of 20 distinct prompts (8 to 160 tokens) is scored alone: the reference answers. Then 16 client
threads send 200 requests each (one prompt per request, chosen round-robin, 20 top log-probs per position):
every answer must match its prompt's reference (the same positions, token ids and ranks, log-probs within
1e-4: a request batched with others is padded, which moves float32 results by about 1e-6; an answer mixed
up between concurrent requests would differ in length or ids), and none may fail. Last, 16 heavy requests
(16 prompts of 480 tokens each) are sent at once and the server gets SIGTERM while they are in flight:
every one must still be answered, correctly. (uvicorn re-raises the signal after its graceful shutdown, so
the server's exit status is -15.)

    python benchmarks/serve_load.py [--clients 16] [--requests 200]
Writes benchmarks/results/serve_load.json and prints a summary.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from provenance import write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import REPO, make_models  # noqa: E402  (a sibling script: the same tiny models)

TOP_K = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def score(port: int, prompt: list[int], timeout: float = 60.0) -> tuple[int, Any]:
    """(HTTP status, prompt_logprobs or the error body) of one request with one prompt."""
    status, answer = score_many(port, [prompt], timeout)
    return status, answer[0] if status == 200 else answer


def same_answer(answer: list, reference: list, tolerance: float = 1e-4) -> bool:
    """The same positions, token ids and ranks, log-probs within `tolerance`."""
    if len(answer) != len(reference):
        return False
    for got, want in zip(answer, reference):
        if got is None or want is None:
            if got is not want:
                return False
            continue
        if got.keys() != want.keys() or any(got[k]["rank"] != want[k]["rank"] or
                                            abs(got[k]["logprob"] - want[k]["logprob"]) > tolerance for k in got):
            return False
    return True


def score_many(port: int, batch: list[list[int]], timeout: float = 120.0) -> tuple[int, Any]:
    """(HTTP status, each prompt's prompt_logprobs or the error body) of one request with several prompts."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = json.dumps({"prompt": batch, "max_tokens": 1, "prompt_logprobs": TOP_K})
    connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    payload = response.read().decode()
    connection.close()
    if response.status != 200:
        return response.status, payload
    return 200, [choice["prompt_logprobs"] for choice in json.loads(payload)["choices"]]


def prompts(vocab: int, count: int = 20) -> list[list[int]]:
    """Distinct prompts of 8 to 160 tokens (ids 2.. avoid the special tokens)."""
    return [[2 + (7 * i + 13 * j) % (vocab - 2) for j in range(8 + 8 * i)] for i in range(count)]


def load(port: int, cases: list[list[int]], references: list, clients: int, requests: int) -> dict:
    latencies, failures, mismatches, lock = [], [], [], threading.Lock()

    def client(c: int) -> None:
        for r in range(requests):
            index = (c * requests + r) % len(cases)
            start = time.perf_counter()
            try:
                status, answer = score(port, cases[index])
            except OSError as error:
                status, answer = -1, repr(error)
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                if status != 200:
                    failures.append((status, str(answer)[:200]))
                elif not same_answer(answer, references[index]):
                    mismatches.append(index)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"requests": len(latencies), "failed": len(failures), "mismatched": len(mismatches), "wall_seconds": wall,
            "requests_per_second": len(latencies) / wall, "p50_ms": 1000 * statistics.median(ordered),
            "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))], "max_ms": 1000 * ordered[-1],
            "first_failures": failures[:3]}


def graceful_shutdown(server: subprocess.Popen, port: int, clients: int) -> dict:
    """SIGTERM with `clients` heavy requests in flight: every one answered correctly."""
    results: list[tuple[int, Any]] = [(-1, "no answer")] * clients
    heavy = [[2 + (5 * i + 3 * j) % 300 for j in range(480)] for i in range(16)]
    reference = score(port, heavy[0])[1]

    def client(c: int) -> None:
        try:
            results[c] = score_many(port, heavy)
        except OSError as error:
            results[c] = (-1, repr(error))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    time.sleep(0.3)  # the requests are read and queued in the batcher by now
    in_flight = sum(t.is_alive() for t in threads)
    server.send_signal(signal.SIGTERM)
    for t in threads:
        t.join()
    code = server.wait(timeout=60)
    answered = sum(1 for status, answers in results if status == 200 and same_answer(answers[0], reference))
    return {"requests": clients, "prompts_per_request": len(heavy), "in_flight_at_sigterm": in_flight, "answered": answered,
            "errors": [str(answer)[:200] for status, answer in results if status != 200][:3], "server_exit_code": code}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "serve_load.json"))
    args = parser.parse_args()
    from distill.commands.serve_teacher import wait_until_healthy

    with tempfile.TemporaryDirectory() as tmp:
        models = make_models(Path(tmp))
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "distill", "serve-teacher", str(models["teacher"]), "--port", str(port),
                                   "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            wait_until_healthy(f"http://127.0.0.1:{port}", 300.0, server)
            vocab = json.loads(Path(models["teacher"], "config.json").read_text())["vocab_size"]
            cases = prompts(vocab)
            references = []
            for case in cases:
                status, answer = score(port, case)
                if status != 200:
                    raise RuntimeError(f"reference request failed: {status} {answer}")
                references.append(answer)
            loaded = load(port, cases, references, args.clients, args.requests)
            shutdown = graceful_shutdown(server, port, args.clients)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
    result = {"clients": args.clients, "requests_per_client": args.requests, "top_k": TOP_K, "load": loaded,
              "shutdown": shutdown}
    print(f"{loaded['requests']} requests from {args.clients} concurrent clients: {loaded['failed']} failed, "
          f"{loaded['mismatched']} mismatched; p50 {loaded['p50_ms']:.1f} ms, p99 {loaded['p99_ms']:.1f} ms, "
          f"{loaded['requests_per_second']:.0f} requests/s")
    print(f"SIGTERM with {shutdown['in_flight_at_sigterm']} of {shutdown['requests']} requests in flight: "
          f"{shutdown['answered']} answered correctly, server exit status {shutdown['server_exit_code']}")
    write_result(args.out, result)
    ok = loaded["failed"] == loaded["mismatched"] == 0 and shutdown["answered"] == shutdown["requests"]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
