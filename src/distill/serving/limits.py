"""What `distill serve-teacher` accepts: the limits a request is checked against before it costs memory or
compute (`ServerLimits`, each naming the option that raises it), and the parsing of a completions request into
token-id prompts (vLLM's forms: ids, lists of ids, text)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TypeGuard

DEFAULT_MAX_LOGPROBS = 20  # vLLM's --max-logprobs default: the K distill asks for by default (teacher_logprobs)
DEFAULT_MAX_REQUEST_BYTES = 4 << 20  # 65,536 token ids as JSON are ~400 KB; 4 MiB leaves room for text prompts
DEFAULT_MAX_PROMPT_TOKENS = 65536


class BadRequest(ValueError):
    """A request this server cannot answer as asked (HTTP `status`, 400 unless said otherwise, with the reason)."""

    status = 400


class TooLarge(BadRequest):
    """The body is larger than --max-request-bytes (HTTP 413)."""

    status = 413


def is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
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
            if not is_int(value) or (value < 1 and not (name == "max_logprobs" and value == -1)):
                extra = " (or -1: no cap)" if name == "max_logprobs" else ""
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= 1{extra}, got {value!r}")


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
    if not is_int(k) or k < 0:
        raise BadRequest(f"prompt_logprobs must be an integer >= 0 (the number of top tokens per position), got {k!r}")
    if limits.max_logprobs != -1 and k > limits.max_logprobs:
        raise BadRequest(f"Requested prompt logprobs of {k}, which is greater than max allowed: {limits.max_logprobs} "
                         "(start serve-teacher with --max-logprobs N to allow more)")
    if body.get("max_tokens", 16) != 1 or not is_int(body.get("max_tokens", 16)):
        raise BadRequest("this server scores prompts only: set max_tokens to 1")
    if body.get("stream") or body.get("echo") or body.get("n", 1) != 1:
        raise BadRequest("stream, echo and n > 1 are not supported")
    temperature = body.get("prompt_logprobs_temperature", 1.0)
    if not is_number(temperature) or not temperature > 0:
        raise BadRequest(f"prompt_logprobs_temperature must be a finite number > 0, got {temperature!r}")
    sampling = body.get("temperature", 1.0)
    if sampling is not None and (not is_number(sampling) or sampling < 0):
        raise BadRequest(f"temperature must be a finite number >= 0, got {sampling!r}")

    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [tokenize_text(tokenizer, prompt)]
    elif isinstance(prompt, list) and prompt and all(is_int(p) for p in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [tokenize_text(tokenizer, p) for p in prompt]
    else:
        raise BadRequest("prompt must be text, a list of token ids, or a list of such lists")
    total = 0
    for p in prompts:
        if not p or not all(is_int(t) and 0 <= t < vocab_size for t in p):
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


