"""`distill serve-teacher`: teacher log-probs over HTTP, in the subset of vLLM's OpenAI-compatible API that
distill's server teacher uses, so the same client talks to this server and to a stock `vllm serve`.

    POST /v1/completions  {"prompt": [ids] | [[ids], ...] | "text" | ["text", ...], "max_tokens": 1,
                           "prompt_logprobs": K, "prompt_logprobs_temperature": T}
        -> choices[i].prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]
           one entry per prompt token (the first has no context and is null); each holds the top-K tokens
           and the token actually there (K or K + 1 entries), like vLLM.
    POST /tokenize        {"prompt": "text"} -> {"tokens": [...], "count": n, "max_model_len": N}
    GET  /health, GET /v1/models

and the hidden-state payload (`distill.teachers.hidden_payload`): the teacher's final hidden states at the
positions a client asks for, in float32 or bfloat16, as a safetensors body, plus the teacher's lm_head once
(`GET /distill/v1/head`) and its fingerprint (`GET /distill/v1/info`). With the head on the trainer they give
the exact full distribution at any temperature: H numbers per token instead of K log-probs.

Temperature: stock vLLM computes prompt log-probs from the raw logits whatever the request's temperature.
This server honours `prompt_logprobs_temperature` (the name of vLLM's proposed parameter) and falls back to
1. The client probes for it at start-up, so a server that ignores it fails early instead of training at
the wrong temperature.

Limits (`ServerLimits`): a request is refused before it costs memory or compute, with a message naming the
limit and the option that raises it, so one bad or hostile client cannot take the server down:
    --max-logprobs N        prompt_logprobs above N -> 400 (vLLM's flag and default, 20; -1: no cap)
    --max-request-bytes B   a body over B bytes -> 413, judged from Content-Length and while reading, before
                            any JSON is parsed (default 4 MiB)
    --max-prompt-tokens T   prompt tokens summed over one request's prompts -> 400 (default 65536)
    context length          a prompt plus the scored next position longer than the model's
                            `max_position_embeddings` -> 400, worded like vLLM's
Malformed bodies (not JSON, not an object, nested too deep, wrong types) are 400s on every endpoint.

Concurrent requests are batched: a single worker takes everything waiting (up to `max_batch_tokens` of
padded prompt tokens), runs padded forward passes on its own thread, and answers each request. A request
bigger than the budget is split into several passes (a single prompt longer than it runs alone), so the
memory of one pass is bounded by `max(max_batch_tokens, longest prompt)` positions whatever the request.
"""

from __future__ import annotations

import ipaddress
import logging
import time

from distill.serving.app import build_app
from distill.serving.limits import ServerLimits, is_int
from distill.serving.scoring import ScoringEngine

logger = logging.getLogger(__name__)


def wait_until_healthy(url: str, timeout: float = 120.0, process=None) -> None:
    """Poll `url`/health until it answers 200 (a server just started); fail early if `process` exits."""
    import http.client
    import urllib.parse

    parsed = urllib.parse.urlsplit(url)
    assert parsed.hostname is not None, f"no host in {url!r}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the teacher server exited with code {process.returncode} before answering")
        try:
            connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=2)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"the teacher server at {url} did not become healthy within {timeout:.0f} s")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(model_spec: str, host: str = "127.0.0.1", port: int = 8000, device: str = "auto", served_model_name: str | None = None,
          max_batch_tokens: int = 16384, limits: ServerLimits | None = None) -> None:
    """Load `model_spec` and serve it until interrupted."""
    import uvicorn

    from distill.teachers.build import load_model
    from distill.training.runtime import eval_device

    limits = limits or ServerLimits()
    if not is_int(max_batch_tokens) or max_batch_tokens < 1:  # before the model loads: fail early
        raise ValueError(f"--max-batch-tokens must be an integer >= 1, got {max_batch_tokens!r}")
    target = eval_device(device)
    model, tokenizer = load_model(model_spec, "model", target)
    engine = ScoringEngine(model, tokenizer, target)
    if not is_loopback(host):
        logger.warning("serve-teacher: listening on %s, reachable from other machines; there is no authentication", host)
    app = build_app(engine, served_model_name or model_spec, max_batch_tokens, limits)
    print(f"serving {model_spec} on http://{host}:{port} (vocab {engine.vocab_size}, context {engine.max_model_len or 'unknown'}, "
          f"{target}; per request at most {limits.max_logprobs} logprobs, {limits.max_prompt_tokens} prompt tokens, "
          f"{limits.max_request_bytes} bytes)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
