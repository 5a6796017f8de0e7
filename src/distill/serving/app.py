"""The HTTP app of `distill serve-teacher` (FastAPI): vLLM's completions, tokenize, health and models endpoints,
and distill's hidden-state payload endpoints, each refusing a request that breaks a limit with vLLM's wording."""

# No `from __future__ import annotations`: FastAPI reads the handlers' `request: Request` annotations at run
# time, and `Request` is imported inside build_app (fastapi loads only when serving).

import asyncio
import logging
import time
import uuid

import torch

from distill.images import IMAGES_FIELD
from distill.serving.limits import BadRequest, ServerLimits, is_int, parse_completion_request, read_json, tokenize_text
from distill.serving.scoring import Batcher, ScoringEngine
from distill.teachers.head import head_bytes
from distill.teachers.hidden_payload import (
    CONTENT_TYPE,
    DTYPES,
    PAYLOAD_FORMAT,
    PAYLOAD_VERSION,
    check_hidden_request,
    encode_hidden,
)

logger = logging.getLogger("distill.commands.serve_teacher")


def build_app(engine: ScoringEngine, model_name: str, max_batch_tokens: int = 16384, limits: ServerLimits | None = None):
    """The FastAPI application (exposed for tests and embedding); `limits` defaults to ServerLimits()."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    limits = limits or ServerLimits()
    if not is_int(max_batch_tokens) or max_batch_tokens < 1:
        raise ValueError(f"--max-batch-tokens must be an integer >= 1, got {max_batch_tokens!r}")
    batcher = Batcher(engine, max_batch_tokens)

    async def lifespan(app):
        batcher.start()
        yield
        assert batcher.worker is not None  # started above
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
            images = request_images(body, len(prompts), engine.processor is not None)
        except BadRequest as bad:
            return error(bad.status, str(bad))
        try:
            choices = await batcher.submit(prompts, ("topk", k, temperature), images=images)
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
                "max_model_len": engine.max_model_len, "images": engine.processor is not None}

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
            images = request_images(body, len(prompts), engine.processor is not None)
        except BadRequest as bad:
            return error(bad.status, str(bad))
        try:
            states = await batcher.submit(prompts, ("hidden", dtype), starts, images)
        except Exception as failure:
            logger.exception("hidden states failed")
            return error(500, f"hidden states failed: {failure}")
        payload = await asyncio.to_thread(encode_hidden, torch.cat(states), [len(s) for s in states], engine.head_sha256)
        return Response(payload, media_type=CONTENT_TYPE)

    return app


def request_images(body: dict, prompts: int, takes_images: bool) -> list[list] | None:
    """The decoded images of a request's `distill_images` (a list parallel to its prompts, each a list of base64
    images), or None when it has none; BadRequest naming the prompt otherwise."""
    from distill.models.vision import decode_png

    given = body.get(IMAGES_FIELD)
    if given is None:
        return None
    if not isinstance(given, list) or len(given) != prompts or not all(isinstance(row, list) for row in given):
        raise BadRequest(f"{IMAGES_FIELD} must be a list of {prompts} lists (one per prompt) of base64 images")
    if not takes_images and any(given):
        raise BadRequest(f"{IMAGES_FIELD}: this teacher is a text-only model; it takes no images")
    try:
        return [[decode_png(text, f"{IMAGES_FIELD}[{i}][{j}]") if isinstance(text, str) else _not_text(i, j)
                 for j, text in enumerate(row)] for i, row in enumerate(given)]
    except ValueError as bad:
        raise BadRequest(str(bad)) from None


def _not_text(i: int, j: int):
    raise ValueError(f"{IMAGES_FIELD}[{i}][{j}] must be base64 text")


