"""`distill serve-teacher`: teacher log-probs over HTTP, in the subset of vLLM's OpenAI-compatible API that
distill's server teacher uses, so the same client talks to this server and to a stock `vllm serve`.

    POST /v1/completions  {"prompt": [ids] | [[ids], ...] | "text", "max_tokens": 1, "prompt_logprobs": K,
                           "prompt_logprobs_temperature": T}
        -> choices[i].prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...]
           one entry per prompt token (the first has no context and is null); each holds the top-K tokens
           and the token actually there (K or K + 1 entries), like vLLM.
    POST /tokenize        {"prompt": "text"} -> {"tokens": [...], "count": n}   (tokenizer check)
    GET  /health, GET /v1/models

Temperature: stock vLLM computes prompt log-probs from the raw logits whatever the request's temperature.
This server honours `prompt_logprobs_temperature` (the name of vLLM's proposed parameter) and falls back to
1. The client probes for it at start-up, so a server that ignores it fails early instead of training at
the wrong temperature.

Concurrent requests are batched: a single worker takes everything waiting (up to `max_batch_tokens` of
padded prompt tokens), runs one padded forward pass per batch on its own thread, and answers each request.
"""


import asyncio
import ipaddress
import logging
import time
import uuid
from dataclasses import dataclass, field

import torch

from distill.losses import LogitHead
from distill.models import logit_head
from distill.teachers.hidden import backbone_hidden
from distill.teachers.topk import topk_log_probs

logger = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A request this server cannot answer as asked (HTTP 400, with the reason)."""


@dataclass
class ScoreJob:
    prompts: list[list[int]]
    k: int
    temperature: float
    future: asyncio.Future = field(repr=False)

    @property
    def width(self) -> int:
        return max(len(p) for p in self.prompts)


class ScoringEngine:
    """Runs the teacher over token-id prompts: per position the top-k and the actual token's log-prob."""

    def __init__(self, model, tokenizer, device: torch.device, chunk_size: int = 256):
        self.model, self.tokenizer, self.device, self.chunk_size = model.eval().requires_grad_(False), tokenizer, device, chunk_size
        self.vocab_size = len(tokenizer)
        self.head: LogitHead = logit_head(model, self.vocab_size)
        self.decoded = tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @torch.inference_mode()
    def score(self, prompts: list[list[int]], k: int, temperature: float) -> list[dict]:
        """One vLLM-shaped choice per prompt: prompt_logprobs and a greedy next token."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention[row, : len(ids)] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        hidden = backbone_hidden(self.model, input_ids, attention)
        # Positions 0..L-2 of each row predict tokens 1..L-1; position L-1 predicts the generated token.
        scored = attention.bool().clone()
        lengths = attention.sum(1)
        targets = input_ids.roll(-1, dims=1)
        last = torch.zeros_like(scored)
        last[torch.arange(len(prompts)), lengths - 1] = True
        predicting = scored & ~last
        top = topk_log_probs(hidden[predicting].float(), self.head, targets[predicting], k, temperature, self.chunk_size)
        next_logits = self.head.full_logits(hidden[last].float())
        next_ids = next_logits.argmax(-1).tolist()
        # JSON has no -inf: like vLLM, a zero-probability token gets -9999.
        ids = top.ids.tolist()
        lps, target_lp = top.log_probs.clamp_min(-9999.0).tolist(), top.target_log_probs.clamp_min(-9999.0).tolist()
        choices, position = [], 0
        for row, prompt in enumerate(prompts):
            entries: list[dict | None] = [None]
            for t in range(1, len(prompt)):
                entry = {str(i): {"logprob": lp, "rank": r + 1, "decoded_token": self.decoded[i]}
                         for r, (i, lp) in enumerate(zip(ids[position], lps[position]))}
                actual = prompt[t]
                if str(actual) not in entry:
                    entry[str(actual)] = {"logprob": target_lp[position], "rank": None, "decoded_token": self.decoded[actual]}
                entries.append(entry)
                position += 1
            choices.append({"index": row, "text": self.tokenizer.decode([next_ids[row]]), "logprobs": None,
                            "finish_reason": "length", "prompt_logprobs": entries, "prompt_token_ids": prompt})
        return choices


class Batcher:
    """Collects concurrent requests and runs them through the engine in batches, one batch at a time."""

    def __init__(self, engine: ScoringEngine, max_batch_tokens: int):
        self.engine, self.max_batch_tokens = engine, max_batch_tokens
        self.queue: asyncio.Queue[ScoreJob] = asyncio.Queue()
        self.worker: asyncio.Task | None = None

    def start(self) -> None:
        self.worker = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, prompts: list[list[int]], k: int, temperature: float) -> list[dict]:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(ScoreJob(prompts, k, temperature, future))
        return await future

    async def _run(self) -> None:
        while True:
            jobs = [await self.queue.get()]
            # The forward pass pads every row to the longest prompt: budget rows x width, not the sum of lengths.
            rows, width = len(jobs[0].prompts), jobs[0].width
            while not self.queue.empty():
                candidate = self.queue._queue[0]  # noqa: SLF001 (peek)
                if (rows + len(candidate.prompts)) * max(width, candidate.width) > self.max_batch_tokens:
                    break
                jobs.append(self.queue.get_nowait())
                rows, width = rows + len(candidate.prompts), max(width, candidate.width)
            # One forward per (k, temperature): requests in a batch normally share both.
            groups: dict[tuple[int, float], list[ScoreJob]] = {}
            for job in jobs:
                groups.setdefault((job.k, job.temperature), []).append(job)
            for (k, temperature), group in groups.items():
                prompts = [p for job in group for p in job.prompts]
                try:
                    choices = await asyncio.to_thread(self.engine.score, prompts, k, temperature)
                except Exception as error:  # answered as a 500 on each request of the batch
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(error)
                    continue
                start = 0
                for job in group:
                    part = choices[start : start + len(job.prompts)]
                    for index, choice in enumerate(part):
                        choice["index"] = index
                    start += len(job.prompts)
                    if not job.future.done():
                        job.future.set_result(part)


def parse_completion_request(body: dict, tokenizer, vocab_size: int) -> tuple[list[list[int]], int, float]:
    """Validate a /v1/completions body; returns (token-id prompts, k, temperature) or raises BadRequest."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [tokenizer(prompt)["input_ids"]]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [tokenizer(p)["input_ids"] for p in prompt]
    else:
        raise BadRequest("prompt must be text, a list of token ids, or a list of such lists")
    for p in prompts:
        if not p or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in p):
            raise BadRequest(f"every prompt must be a non-empty list of token ids in [0, {vocab_size})")
    if body.get("max_tokens", 16) != 1:
        raise BadRequest("this server scores prompts only: set max_tokens to 1")
    if body.get("stream") or body.get("echo") or body.get("n", 1) != 1:
        raise BadRequest("stream, echo and n > 1 are not supported")
    k = body.get("prompt_logprobs")
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise BadRequest("prompt_logprobs must be an integer >= 0 (the number of top tokens per position)")
    temperature = body.get("prompt_logprobs_temperature", 1.0)
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise BadRequest("prompt_logprobs_temperature must be a number > 0")
    return prompts, min(max(k, 1), vocab_size), float(temperature)


def build_app(engine: ScoringEngine, model_name: str, max_batch_tokens: int = 16384):
    """The FastAPI application (exposed for tests and embedding)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    batcher = Batcher(engine, max_batch_tokens)

    async def lifespan(app):
        batcher.start()
        yield
        batcher.worker.cancel()

    app = FastAPI(title="distill teacher", lifespan=lifespan)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "BadRequestError" if status == 400 else "InternalServerError",
                                       "code": status}}, status_code=status)

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "max_model_len": None}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        body = await request.json()
        if not isinstance(body.get("prompt"), str):
            return error(400, "prompt must be text")
        tokens = engine.tokenizer(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
        return {"tokens": tokens, "count": len(tokens), "max_model_len": None}

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            if body.get("model") not in (None, model_name):
                raise BadRequest(f"model {body.get('model')!r} is not served here; this server serves {model_name!r}")
            prompts, k, temperature = parse_completion_request(body, engine.tokenizer, engine.vocab_size)
        except BadRequest as bad:
            return error(400, str(bad))
        except ValueError:
            return error(400, "the body is not valid JSON")
        try:
            choices = await batcher.submit(prompts, k, temperature)
        except Exception as failure:  # a model error: the client retries 5xx
            logger.exception("scoring failed")
            return error(500, f"scoring failed: {failure}")
        tokens = sum(len(p) for p in prompts)
        # JSONResponse serialises with json.dumps directly (FastAPI's generic encoder walks every entry in Python).
        return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                             "model": model_name, "choices": choices,
                             "usage": {"prompt_tokens": tokens, "completion_tokens": len(prompts), "total_tokens": tokens + len(prompts)}})

    return app


def wait_until_healthy(url: str, timeout: float = 120.0, process=None) -> None:
    """Poll `url`/health until it answers 200 (a server just started); fail early if `process` exits."""
    import http.client
    import urllib.parse

    parsed = urllib.parse.urlsplit(url)
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
          max_batch_tokens: int = 16384) -> None:
    """Load `model_spec` and serve it until interrupted."""
    import uvicorn

    from distill.runtime import eval_device
    from distill.teachers.build import load_model

    target = eval_device(device)
    model, tokenizer = load_model(model_spec, "model", target)
    engine = ScoringEngine(model, tokenizer, target)
    if not is_loopback(host):
        logger.warning("serve-teacher: listening on %s, reachable from other machines; there is no authentication", host)
    app = build_app(engine, served_model_name or model_spec, max_batch_tokens)
    print(f"serving {model_spec} on http://{host}:{port} (vocab {engine.vocab_size}, {target})", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
