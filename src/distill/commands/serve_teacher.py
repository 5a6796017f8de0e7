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


import asyncio
import ipaddress
import json
import logging
import math
import time
import uuid
from dataclasses import dataclass, field

import torch

from distill.losses import LogitHead
from distill.models import context_length, logit_head
from distill.teachers.head import head_bytes, head_fingerprint
from distill.teachers.hidden import backbone_hidden
from distill.teachers.hidden_payload import (
    CONTENT_TYPE,
    DTYPES,
    PAYLOAD_FORMAT,
    PAYLOAD_VERSION,
    check_hidden_request,
    encode_hidden,
)
from distill.teachers.topk import topk_log_probs

logger = logging.getLogger(__name__)


DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default: the K distill asks for by default (teacher_logprobs)
DEFAULT_MAX_REQUEST_BYTES = 4 << 20  # 65,536 token ids as JSON are ~400 KB; 4 MiB leaves room for text prompts
DEFAULT_MAX_PROMPT_TOKENS = 65536


class BadRequest(ValueError):
    """A request this server cannot answer as asked (HTTP `status`, 400 unless said otherwise, with the reason)."""

    status = 400


class TooLarge(BadRequest):
    """The body is larger than --max-request-bytes (HTTP 413)."""

    status = 413


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ServerLimits:
    """What one request may ask of the server; each refusal names its limit and the option raising it.

    max_logprobs: the most `prompt_logprobs` (top tokens per position) a request may ask for; -1 allows the
        whole vocabulary (as in vLLM). Without a cap a request for 10^9 gets every vocabulary entry at every
        position (hundreds of MB per answer).
    max_request_bytes: the most bytes of one request body, checked before the body is parsed.
    max_prompt_tokens: the most prompt tokens of one request, summed over its prompts (text after tokenizing).
    """

    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS

    def __post_init__(self):
        for name in ("max_logprobs", "max_request_bytes", "max_prompt_tokens"):
            value = getattr(self, name)
            if not _is_int(value) or (value < 1 and not (name == "max_logprobs" and value == -1)):
                extra = " (or -1: no cap)" if name == "max_logprobs" else ""
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1{extra}, got {value!r}")


def padded_slices(prompts: list[list[int]], max_batch_tokens: int) -> list[slice]:
    """Consecutive runs of `prompts` whose padded size (rows x longest) fits `max_batch_tokens`; a prompt
    longer than the budget gets a run of its own. Order is kept, so answers line up with the prompts."""
    slices, start, width = [], 0, 0
    for end, prompt in enumerate(prompts):
        wider = max(width, len(prompt))
        if end > start and (end - start + 1) * wider > max_batch_tokens:
            slices.append(slice(start, end))
            start, wider = end, len(prompt)
        width = wider
    if prompts:
        slices.append(slice(start, len(prompts)))
    return slices


@dataclass
class ScoreJob:
    """prompts, and what to compute for them: key ("topk", k, temperature) or ("hidden", dtype name), with
    `starts` (the first predicted token of each prompt) for hidden states."""

    prompts: list[list[int]]
    key: tuple
    future: asyncio.Future = field(repr=False)
    starts: list[int] | None = None

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
        self.max_model_len = context_length(model)
        self.hidden_size = self.head.weight.shape[1]
        self.head_sha256 = head_fingerprint(self.head)

    def run(self, key: tuple, prompts: list[list[int]], starts: list[int] | None) -> list:
        """One result per prompt: a vLLM-shaped choice ("topk") or a (len - start, H) tensor ("hidden")."""
        if key[0] == "hidden":
            return self.hidden_states(prompts, starts, DTYPES[key[1]])
        return self.score(prompts, key[1], key[2])

    def _padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention[row, : len(ids)] = 1
        return input_ids.to(self.device), attention.to(self.device)

    @torch.inference_mode()
    def hidden_states(self, prompts: list[list[int]], starts: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
        """Per prompt, the final hidden states (len - start, H) at positions start-1 .. len-2 (those predicting
        tokens start .. len-1), on the CPU in `dtype`."""
        input_ids, attention = self._padded(prompts)
        hidden = backbone_hidden(self.model, input_ids, attention)
        return [hidden[row, start - 1 : len(prompt) - 1].to("cpu", dtype) for row, (prompt, start) in enumerate(zip(prompts, starts))]

    @torch.inference_mode()
    def score(self, prompts: list[list[int]], k: int, temperature: float) -> list[dict]:
        """One vLLM-shaped choice per prompt: prompt_logprobs and a greedy next token."""
        input_ids, attention = self._padded(prompts)
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

    async def submit(self, prompts: list[list[int]], key: tuple, starts: list[int] | None = None) -> list:
        """One result per prompt (`ScoringEngine.run`)."""
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(ScoreJob(prompts, key, future, starts))
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
            # One forward per key ((k, temperature) or the hidden states' dtype): a batch's requests normally share it.
            groups: dict[tuple, list[ScoreJob]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            for key, group in groups.items():
                prompts = [p for job in group for p in job.prompts]
                starts = [s for job in group for s in (job.starts or [None] * len(job.prompts))]
                try:
                    results = []
                    for part in padded_slices(prompts, self.max_batch_tokens):
                        results += await asyncio.to_thread(self.engine.run, key, prompts[part], starts[part])
                except Exception as error:  # answered as a 500 on each request of the batch
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(error)
                    continue
                start = 0
                for job in group:
                    part = results[start : start + len(job.prompts)]
                    start += len(job.prompts)
                    if not job.future.done():
                        job.future.set_result(part)


def tokenize_text(tokenizer, text: str, **kwargs) -> list[int]:
    """Token ids of `text`; text JSON can carry but UTF-8 cannot (a lone surrogate, "\\ud800") is a BadRequest,
    not a tokenizer TypeError answered as a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest("prompt text is not valid Unicode (it holds a lone surrogate escape such as \\ud800)") from None
    return tokenizer(text, **kwargs)["input_ids"]


def parse_completion_request(body: dict, tokenizer, vocab_size: int, limits: ServerLimits = ServerLimits(),
                             max_model_len: int | None = None) -> tuple[list[list[int]], int, float]:
    """Validate a /v1/completions body; returns (token-id prompts, k, temperature) or raises BadRequest.

    Cheap checks come first (types, prompt_logprobs against --max-logprobs), then the prompts are tokenized
    and counted against --max-prompt-tokens and the model's context length.
    """
    k = body.get("prompt_logprobs")
    if not _is_int(k) or k < 0:
        raise BadRequest(f"prompt_logprobs must be an integer >= 0 (the number of top tokens per position), got {k!r}")
    if limits.max_logprobs != -1 and k > limits.max_logprobs:
        raise BadRequest(f"Requested prompt logprobs of {k}, which is greater than max allowed: {limits.max_logprobs} "
                         "(start serve-teacher with --max-logprobs N to allow more)")
    if body.get("max_tokens", 16) != 1 or not _is_int(body.get("max_tokens", 16)):
        raise BadRequest("this server scores prompts only: set max_tokens to 1")
    if body.get("stream") or body.get("echo") or body.get("n", 1) != 1:
        raise BadRequest("stream, echo and n > 1 are not supported")
    temperature = body.get("prompt_logprobs_temperature", 1.0)
    if not _is_number(temperature) or not temperature > 0:
        raise BadRequest(f"prompt_logprobs_temperature must be a finite number > 0, got {temperature!r}")
    sampling = body.get("temperature", 1.0)
    if sampling is not None and (not _is_number(sampling) or sampling < 0):
        raise BadRequest(f"temperature must be a finite number >= 0, got {sampling!r}")

    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [tokenize_text(tokenizer, prompt)]
    elif isinstance(prompt, list) and prompt and all(_is_int(p) for p in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [tokenize_text(tokenizer, p) for p in prompt]
    else:
        raise BadRequest("prompt must be text, a list of token ids, or a list of such lists")
    total = 0
    for p in prompts:
        if not p or not all(_is_int(t) and 0 <= t < vocab_size for t in p):
            raise BadRequest(f"every prompt must be a non-empty list of token ids in [0, {vocab_size})")
        total += len(p)
        if total > limits.max_prompt_tokens:
            total = sum(len(p) for p in prompts)
            raise BadRequest(f"the request holds {total} prompt tokens, more than this server's limit of "
                             f"{limits.max_prompt_tokens} per request: split it into smaller requests, or start "
                             "serve-teacher with --max-prompt-tokens N")
        if max_model_len is not None and len(p) + 1 > max_model_len:
            raise BadRequest(f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                             f"{len(p) + 1} tokens ({len(p)} in the prompt, 1 in the completion). Please reduce the "
                             "length of the prompt.")
    return prompts, min(max(k, 1), vocab_size), float(temperature)


async def read_json(request, max_bytes: int) -> object:
    """The request's JSON body, refused (TooLarge) past `max_bytes` before it is held in memory: by its
    Content-Length when sent, and by counting the bytes as they arrive (chunked bodies, or a lying header)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
        raise TooLarge(f"the request body is {int(declared)} bytes, more than this server's limit of {max_bytes} bytes: "
                       "send smaller requests, or start serve-teacher with --max-request-bytes N")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(f"the request body is over this server's limit of {max_bytes} bytes: send smaller requests, "
                           "or start serve-teacher with --max-request-bytes N")
        parts.append(chunk)
    try:
        return json.loads(b"".join(parts))
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's stack ("[[[[...")
        raise BadRequest("the body is not valid JSON") from None


def build_app(engine: ScoringEngine, model_name: str, max_batch_tokens: int = 16384, limits: ServerLimits | None = None):
    """The FastAPI application (exposed for tests and embedding); `limits` defaults to ServerLimits()."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    limits = limits or ServerLimits()
    if not _is_int(max_batch_tokens) or max_batch_tokens < 1:
        raise ValueError(f"--max-batch-tokens must be an integer >= 1, got {max_batch_tokens!r}")
    batcher = Batcher(engine, max_batch_tokens)

    async def lifespan(app):
        batcher.start()
        yield
        batcher.worker.cancel()

    app = FastAPI(title="distill teacher", lifespan=lifespan)
    kinds = {400: "BadRequestError", 413: "RequestTooLargeError"}

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kinds.get(status, "InternalServerError"), "code": status}},
                            status_code=status)

    async def json_object(request: Request) -> dict:
        body = await read_json(request, limits.max_request_bytes)
        if not isinstance(body, dict):
            kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(body), "number")
            raise BadRequest(f"the body must be a JSON object, not a JSON {kind}")
        return body

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "max_model_len": engine.max_model_len}]}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        try:
            body = await json_object(request)
            if not isinstance(body.get("prompt"), str):
                raise BadRequest("prompt must be text")
            special = body.get("add_special_tokens", True)
            if not isinstance(special, bool):
                raise BadRequest(f"add_special_tokens must be true or false, got {special!r}")
            tokens = tokenize_text(engine.tokenizer, body["prompt"], add_special_tokens=special)
        except BadRequest as bad:
            return error(bad.status, str(bad))
        return {"tokens": tokens, "count": len(tokens), "max_model_len": engine.max_model_len}

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            body = await json_object(request)
            if body.get("model") not in (None, model_name):
                raise BadRequest(f"model {body.get('model')!r} is not served here; this server serves {model_name!r}")
            prompts, k, temperature = parse_completion_request(body, engine.tokenizer, engine.vocab_size, limits,
                                                               engine.max_model_len)
        except BadRequest as bad:
            return error(bad.status, str(bad))
        try:
            choices = await batcher.submit(prompts, ("topk", k, temperature))
        except Exception as failure:  # a model error: the client retries 5xx
            logger.exception("scoring failed")
            return error(500, f"scoring failed: {failure}")
        for index, choice in enumerate(choices):
            choice["index"] = index
        tokens = sum(len(p) for p in prompts)
        # JSONResponse serialises with json.dumps directly (FastAPI's generic encoder walks every entry in Python).
        return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                             "model": model_name, "choices": choices,
                             "usage": {"prompt_tokens": tokens, "completion_tokens": len(prompts), "total_tokens": tokens + len(prompts)}})

    head_file: list[bytes] = []  # the head's safetensors bytes, made on the first request for them

    @app.get("/distill/v1/info")
    async def info():
        return {"format": PAYLOAD_FORMAT, "version": PAYLOAD_VERSION, "model": model_name, "hidden_size": engine.hidden_size,
                "vocab_size": engine.vocab_size, "head_sha256": engine.head_sha256, "dtypes": sorted(DTYPES),
                "max_model_len": engine.max_model_len}

    @app.get("/distill/v1/head")
    async def head():
        if not head_file:
            head_file.append(await asyncio.to_thread(head_bytes, engine.head))
        return Response(head_file[0], media_type=CONTENT_TYPE)

    @app.post("/distill/v1/hidden_states")
    async def hidden_states(request: Request):
        try:
            body = await json_object(request)
            if body.get("model") not in (None, model_name):
                raise BadRequest(f"model {body.get('model')!r} is not served here; this server serves {model_name!r}")
            try:
                prompts, starts, dtype = check_hidden_request(body, engine.vocab_size, limits.max_prompt_tokens,
                                                              engine.max_model_len)
            except ValueError as bad:
                raise BadRequest(str(bad)) from None
        except BadRequest as bad:
            return error(bad.status, str(bad))
        try:
            states = await batcher.submit(prompts, ("hidden", dtype), starts)
        except Exception as failure:
            logger.exception("hidden states failed")
            return error(500, f"hidden states failed: {failure}")
        payload = await asyncio.to_thread(encode_hidden, torch.cat(states), [len(s) for s in states], engine.head_sha256)
        return Response(payload, media_type=CONTENT_TYPE)

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
          max_batch_tokens: int = 16384, limits: ServerLimits | None = None) -> None:
    """Load `model_spec` and serve it until interrupted."""
    import uvicorn

    from distill.runtime import eval_device
    from distill.teachers.build import load_model

    limits = limits or ServerLimits()
    if not _is_int(max_batch_tokens) or max_batch_tokens < 1:  # before the model loads: fail early
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
