"""A teacher behind a server that sends its final hidden states (`teacher_payload: hidden`): `distill
serve-teacher` (`distill.teachers.hidden_payload`), or stock vLLM's pooling runner (`vllm serve MODEL --runner
pooling`, per-token states from `POST /pooling` with task token_embed and no activation), which has no head
endpoint: with it the head comes from the teacher's files (`teacher_head`), checked only by its shape.

The trainer holds the teacher's lm_head (from the server once at start, or read from the teacher's own files
with `teacher_head`), checked against the fingerprint the server announces. Each step the client asks for the
hidden states at every completion-predicting position, in requests of `teacher_request_size` completions sent
concurrently, and gives a `DenseSignal`: the same signal a teacher model on this process gives, so the loss,
its temperature and every beta are exactly the local teacher's (the server applies no temperature: the
trainer does, on both sides). Transport failures retry like the top-K client's (`CompletionsClient`); an
answer of the wrong count, width, head or with non-finite values is refused.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from distill.batch import MicroBatch
from distill.errors import TeacherServerError
from distill.losses import LogitHead
from distill.signals import DenseSignal
from distill.teachers.base import Teacher
from distill.teachers.head import (
    head_fingerprint,
    head_from_bytes,
    head_from_model_files,
)
from distill.teachers.hidden_payload import (
    PAYLOAD_FORMAT,
    PAYLOAD_VERSION,
    decode_hidden,
)
from distill.teachers.topk_client import (
    CompletionsClient,
    MalformedResponse,
    ScoreRequests,
    ServerSettings,
    check_server,
    check_takes_images,
    completion_prompts,
)


class HiddenStateServerTeacher(Teacher):
    """Scores micro-batches with the server's hidden states and the teacher head held here (a `DenseSignal`)."""

    can_generate = False
    frozen = True  # its weights never change during the run (`Teacher.frozen`)

    def __init__(self, settings: ServerSettings, vocab_size: int, dtype: str = "float32"):
        self.settings, self.vocab_size, self.dtype = settings, vocab_size, dtype
        self.model_name = settings.model
        self.client = CompletionsClient(settings)
        self.pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="teacher-http")
        self.head: LogitHead | None = None
        self.head_sha256 = ""
        self.protocol = "distill"  # or "vllm": stock vLLM's /pooling
        self._images_checked: list = []  # the server said it reads images (`check_takes_images`)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def check(self, tokenizer, head_path: str | None = None) -> None:
        """At set-up: the server speaks the payload, shares the student's tokenizer and vocabulary, and its head
        is the one loaded here (from `head_path`, the teacher's files, or from the server)."""
        self.model_name = check_server(self.client, tokenizer, self.model_name)
        try:
            info = self.client.request("GET", "/distill/v1/info")
        except TeacherServerError as refused:
            if refused.status != 404:
                raise
            self._check_vllm_pooling(tokenizer, head_path)
            return
        if not isinstance(info, dict) or info.get("format") != PAYLOAD_FORMAT or info.get("version") != PAYLOAD_VERSION:
            raise ValueError(f"teacher_url {self.settings.url}: /distill/v1/info is not a {PAYLOAD_FORMAT} v{PAYLOAD_VERSION} "
                             f"answer ({str(info)[:200]})")
        if info.get("vocab_size") != self.vocab_size:
            raise ValueError(f"teacher_url {self.settings.url}: the server's vocabulary has {info.get('vocab_size')} tokens, "
                             f"the student's {self.vocab_size}")
        if head_path is None:
            head = self.client.request("GET", "/distill/v1/head", binary=True,
                                       parse=lambda raw, headers: _parse_head(raw, f"{self.settings.url}/distill/v1/head"))
        else:
            head = head_from_model_files(head_path, self.vocab_size)
        where = f"teacher_head {head_path}" if head_path else f"the head {self.settings.url} sent"
        if head.weight.shape != (info.get("vocab_size"), info.get("hidden_size")):
            raise ValueError(f"{where} is {tuple(head.weight.shape)}, the server's teacher is "
                             f"({info.get('vocab_size')}, {info.get('hidden_size')}): another model")
        sha = head_fingerprint(head)
        if sha != info.get("head_sha256"):
            raise ValueError(f"{where} does not match the server's model (fingerprint {sha[:12]} vs {str(info.get('head_sha256'))[:12]}): "
                             "another model or revision; point teacher_head at the served model's files, or leave it unset")
        self.head, self.head_sha256 = head, sha

    def _check_vllm_pooling(self, tokenizer, head_path: str | None) -> None:
        """The server has no /distill/v1/info: stock vLLM's pooling runner, or a server without hidden states."""
        probe = (tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"] or [0])[:4]
        try:
            width = self._vllm_pooling([probe], [1])[0].shape[1]
        except TeacherServerError as refused:
            if refused.status not in (400, 404):
                raise
            raise ValueError(f"teacher_payload: hidden needs a server that sends hidden states: `distill serve-teacher`, or "
                             f"stock vLLM started with --runner pooling --pooler-config '{VLLM_POOLER_CONFIG}'; "
                             f"{self.settings.url} answers only vLLM's prompt_logprobs. Use teacher_payload: topk with this "
                             "server") from None
        if head_path is None:
            raise ValueError(f"teacher_head: {self.settings.url} is stock vLLM's pooling runner, which sends no lm_head: set "
                             "teacher_head to the served model's directory (the same files the server loaded)")
        head = head_from_model_files(head_path, self.vocab_size)
        if head.weight.shape != (self.vocab_size, width):
            raise ValueError(f"teacher_head {head_path} is {tuple(head.weight.shape)}, the server's states are {width} wide "
                             f"over a vocabulary of {self.vocab_size}: another model")
        self.head, self.head_sha256, self.protocol = head, head_fingerprint(head), "vllm"

    def _vllm_pooling(self, prompts: list[list[int]], starts: list[int]) -> list[torch.Tensor]:
        """Per prompt, rows start-1 .. len-2 of stock vLLM's per-token states (it sends every position)."""
        payload = {"input": prompts, "task": "token_embed", "use_activation": False, "encoding_format": "bytes",
                   "embed_dtype": self.dtype, "endianness": "little", **({"model": self.model_name} if self.model_name else {})}
        return self.client.request("POST", "/pooling", payload, binary=True,
                                   parse=lambda raw, headers: _parse_vllm_pooling(raw, headers, prompts, starts))

    def hidden_states(self, prompts: list[list[int]], starts: list[int], requests: ScoreRequests | None = None):
        """(sum(len - start), H) float32 for the prompts, through concurrent requests of `request_size` prompts (with
        the images of `requests`' rows, when they show any: distill's server only)."""
        size, width = self.settings.request_size, self.head.weight.shape[1]
        groups = [(prompts[i : i + size], starts[i : i + size], slice(i, i + size)) for i in range(0, len(prompts), size)]

        def send(group):
            group_prompts, group_starts, part = group
            if self.protocol == "vllm":
                states = self._vllm_pooling(group_prompts, group_starts)
                if any(s.shape[1] != width for s in states):
                    raise TeacherServerError(f"the server's states are {states[0].shape[1]} wide, the head {width}")
                return torch.cat(states)
            counts = [len(p) - s for p, s in zip(group_prompts, group_starts)]
            payload = {"prompts": group_prompts, "starts": group_starts, "dtype": self.dtype,
                       **({"model": self.model_name} if self.model_name else {}),
                       **(requests.images_field(part) if requests is not None else {})}
            return self.client.request("POST", "/distill/v1/hidden_states", payload, binary=True,
                                       parse=lambda raw, headers: _parse_hidden(raw, counts, width, self.head_sha256))

        parts = list(self.pool.map(send, groups))
        return torch.cat(parts) if parts else torch.empty(0, width)

    def score(self, batch: MicroBatch, temperature: float) -> DenseSignal:
        return self.score_many([batch], temperature)[0]

    def score_many(self, batches: list[MicroBatch], temperature: float) -> list[DenseSignal]:
        """All micro-batches of a step in one concurrent round; the loss applies `temperature` to both sides."""
        requests = completion_prompts(batches)
        if self.protocol == "vllm" and any(requests.images):
            raise ValueError("teacher_url: rows show images, and vLLM's /pooling endpoint takes token ids only; serve the "
                             "vision-language teacher with `distill serve-teacher`")
        check_takes_images(self.client, requests, self._images_checked)
        counts = [len(prompt) - start for prompt, start in zip(requests.prompts, requests.starts)]
        answered = self.hidden_states(requests.prompts, requests.starts, requests)
        if answered.shape[0] != sum(counts):
            raise TeacherServerError(f"the server sent {answered.shape[0]} hidden states for {sum(counts)} positions")
        parts = [requests.select(i, rows) for i, rows in enumerate(answered.split(counts))]
        hidden = torch.cat(parts) if parts else answered
        signals, row = [], 0
        for batch in batches:
            count = batch.num_completion_tokens
            if row + count > hidden.shape[0]:
                raise TeacherServerError(f"the server sent {hidden.shape[0]} hidden states for more completion tokens")
            signals.append(DenseSignal(hidden[row : row + count], self.head))
            row += count
        if row != hidden.shape[0]:
            raise TeacherServerError(f"the server sent {hidden.shape[0]} hidden states for {row} completion tokens")
        return signals


VLLM_POOLER_CONFIG = '{"task": "token_embed", "use_activation": false}'
_VLLM_DTYPES = {"float32": (torch.float32, 4), "bfloat16": (torch.bfloat16, 2)}


def _parse_vllm_pooling(raw: bytes, headers, prompts: list[list[int]], starts: list[int]) -> list[torch.Tensor]:
    """vLLM's bytes encoding: the body holds each output's array, the `metadata` header their places and shapes."""
    import json

    try:
        items = sorted(json.loads(headers.get("metadata") or "")["data"], key=lambda item: item["index"])
    except (ValueError, KeyError, TypeError):
        raise MalformedResponse("a /pooling answer without its metadata header (encoding_format bytes)") from None
    if len(items) != len(prompts):
        raise MalformedResponse(f"{len(items)} pooling outputs for {len(prompts)} prompts")
    states = []
    for item, prompt, start in zip(items, prompts, starts):
        dtype, size = _VLLM_DTYPES.get(item.get("embed_dtype"), (None, 0))
        shape = item.get("shape")
        if dtype is None or item.get("endianness") not in ("little", "native") or not isinstance(shape, list) or len(shape) != 2:
            raise MalformedResponse(f"a pooling output of dtype {item.get('embed_dtype')}, shape {shape}: not per-token states")
        if shape[0] != len(prompt) or item["end"] - item["start"] != shape[0] * shape[1] * size:
            raise MalformedResponse(f"a pooling output of shape {shape} for a prompt of {len(prompt)} tokens")
        array = torch.frombuffer(bytearray(raw[item["start"] : item["end"]]), dtype=dtype).reshape(shape).float()
        if not torch.isfinite(array).all():
            raise MalformedResponse("the pooling output holds non-finite values")
        states.append(array[start - 1 : len(prompt) - 1])
    return states


def _parse_head(raw: bytes, where: str) -> LogitHead:
    try:
        return head_from_bytes(raw, where)
    except ValueError as error:
        raise MalformedResponse(str(error)) from None


def _parse_hidden(raw: bytes, counts: list[int], width: int, head_sha256: str):
    try:
        return decode_hidden(raw, counts, width, head_sha256)
    except ValueError as error:
        raise MalformedResponse(str(error)) from None
