"""A teacher behind `distill serve-teacher` that sends its final hidden states (`teacher_payload: hidden`).

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
from distill.teachers.server import (
    CompletionsClient,
    MalformedResponse,
    ServerSettings,
    check_server,
    completion_prompts,
)


class HiddenStateServerTeacher:
    """Scores micro-batches with the server's hidden states and the teacher head held here (a `DenseSignal`)."""

    can_generate = False

    def __init__(self, settings: ServerSettings, vocab_size: int, dtype: str = "float32"):
        self.settings, self.vocab_size, self.dtype = settings, vocab_size, dtype
        self.model_name = settings.model
        self.client = CompletionsClient(settings)
        self.pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="teacher-http")
        self.head: LogitHead | None = None
        self.head_sha256 = ""

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def check(self, tokenizer, head_path: str | None = None) -> None:
        """At set-up: the server speaks the payload, shares the student's tokenizer and vocabulary, and its head
        is the one loaded here (from `head_path`, the teacher's files, or from the server)."""
        self.model_name = check_server(self.client, tokenizer, self.model_name)
        try:
            info = self.client.request("GET", "/distill/v1/info")
        except TeacherServerError as refused:
            if getattr(refused, "status", None) == 404:
                raise ValueError(f"teacher_payload: hidden needs a server that sends hidden states (`distill serve-teacher`); "
                                 f"{self.settings.url} answers only vLLM's prompt_logprobs (no /distill/v1/info). Use "
                                 "teacher_payload: topk with this server") from None
            raise
        if not isinstance(info, dict) or info.get("format") != PAYLOAD_FORMAT or info.get("version") != PAYLOAD_VERSION:
            raise ValueError(f"teacher_url {self.settings.url}: /distill/v1/info is not a {PAYLOAD_FORMAT} v{PAYLOAD_VERSION} "
                             f"answer ({str(info)[:200]})")
        if info.get("vocab_size") != self.vocab_size:
            raise ValueError(f"teacher_url {self.settings.url}: the server's vocabulary has {info.get('vocab_size')} tokens, "
                             f"the student's {self.vocab_size}")
        if head_path is None:
            head = self.client.request("GET", "/distill/v1/head", binary=True,
                                       parse=lambda raw: _parse_head(raw, f"{self.settings.url}/distill/v1/head"))
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

    def hidden_states(self, prompts: list[list[int]], starts: list[int]):
        """(sum(len - start), H) float32 for the prompts, through concurrent requests of `request_size` prompts."""
        size, width = self.settings.request_size, self.head.weight.shape[1]
        groups = [(prompts[i : i + size], starts[i : i + size]) for i in range(0, len(prompts), size)]

        def send(group):
            group_prompts, group_starts = group
            counts = [len(p) - s for p, s in zip(group_prompts, group_starts)]
            payload = {"prompts": group_prompts, "starts": group_starts, "dtype": self.dtype,
                       **({"model": self.model_name} if self.model_name else {})}
            return self.client.request("POST", "/distill/v1/hidden_states", payload, binary=True,
                                       parse=lambda raw: _parse_hidden(raw, counts, width, self.head_sha256))

        parts = list(self.pool.map(send, groups))
        return torch.cat(parts) if parts else torch.empty(0, width)

    def score(self, batch: MicroBatch, temperature: float) -> DenseSignal:
        return self.score_many([batch], temperature)[0]

    def score_many(self, batches: list[MicroBatch], temperature: float) -> list[DenseSignal]:
        """All micro-batches of a step in one concurrent round; the loss applies `temperature` to both sides."""
        prompts, starts = completion_prompts(batches)
        hidden = self.hidden_states(prompts, starts)
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
