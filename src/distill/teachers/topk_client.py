"""A client of a teacher server speaking vLLM's OpenAI-compatible `/v1/completions` (top-k log-probs).

For each completion of a micro-batch, the client sends the token ids of prompt + completion with
`max_tokens = 1` and `prompt_logprobs = K`, and reads, at every completion position, the top-K ids with
their log-probs and the log-prob of the token actually there. Prompts are grouped into requests of
`request_size` and sent concurrently through a pool of `concurrency` connections. Connection errors,
timeouts, 5xx answers and malformed answers are retried with exponential backoff; after the last attempt a
`TeacherServerError` says what went wrong (the trainer checkpoints and stops). A 4xx answer is not retried:
the request itself is wrong. Nothing a server sends reaches the loss unchecked: wrong lengths, missing
positions, ids outside the vocabulary, non-finite or positive log-probs are all errors.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from distill.batch import MicroBatch
from distill.errors import TeacherServerError
from distill.images import IMAGES_FIELD, ImageRef
from distill.models.vision import encode_png
from distill.signals import SparseSignal
from distill.teachers.base import Teacher


class MalformedResponse(ValueError):
    """A response that does not have the shape the protocol promises; retried, then reported."""


@dataclass(frozen=True)
class ServerSettings:
    url: str
    top_k: int
    model: str | None = None
    concurrency: int = 4
    request_size: int = 8
    timeout_s: float = 60.0
    retries: int = 3
    backoff_s: float = 0.5


@dataclass
class PositionLogProbs:
    """One prompt's completion positions: ids (L, K), log_probs (L, K), target_log_probs (L,)."""

    ids: torch.Tensor
    log_probs: torch.Tensor
    target_log_probs: torch.Tensor


class CompletionsClient:
    """Thread-safe JSON-over-HTTP client with one keep-alive connection per worker thread."""

    def __init__(self, settings: ServerSettings):
        parsed = urllib.parse.urlsplit(settings.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"teacher_url must look like http://host:port, got {settings.url!r}")
        self.settings = settings
        self.scheme, self.host, self.port = parsed.scheme, parsed.hostname, parsed.port
        self.base_path = parsed.path.rstrip("/")
        if self.base_path.endswith("/v1"):
            self.base_path = self.base_path[:-3]
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            connection = kind(self.host, self.port, timeout=self.settings.timeout_s)
            self._local.connection = connection
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _exchange(self, method: str, path: str, payload: dict | None) -> tuple[http.client.HTTPResponse, bytes]:
        """One request/response. A kept-alive connection the server closed while idle (uvicorn closes them after
        a few seconds, shorter than a training step) is reopened and the request resent once, without counting
        as a failed attempt: nothing reached the server."""
        body = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        reused = getattr(self._local, "connection", None) is not None
        try:
            connection = self._connection()
            connection.request(method, self.base_path + path, body=body, headers=headers)
            response = connection.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            if not reused:
                raise
            self._drop_connection()
            connection = self._connection()
            connection.request(method, self.base_path + path, body=body, headers=headers)
            response = connection.getresponse()
        return response, response.read()

    def request(self, method: str, path: str, payload: dict | None = None, parse=lambda body: body, binary: bool = False) -> object:
        """Send one request, retrying transient failures; `parse(decoded_json)` (`parse(raw_body, headers)` when
        `binary`) may raise MalformedResponse. A 4xx answer raises TeacherServerError at once, its `status` set."""
        attempts = self.settings.retries + 1
        last = "no attempt"
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.settings.backoff_s * 2 ** (attempt - 1))
            try:
                response, raw = self._exchange(method, path, payload)
            except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, bad status line
                self._drop_connection()
                last = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                continue
            if 400 <= response.status < 500:
                refused = TeacherServerError(f"teacher server {self.settings.url} refused {path} ({response.status}): "
                                             f"{raw[:500].decode(errors='replace')}")
                refused.status = response.status
                raise refused
            if response.status >= 500:
                last = f"HTTP {response.status}: {raw[:200].decode(errors='replace')}"
                continue
            try:
                if binary:
                    return parse(raw, response.headers)
                decoded = json.loads(raw) if raw.strip() else None  # vLLM's /health answers with an empty body
                return parse(decoded)
            except (ValueError, MalformedResponse) as error:
                last = f"malformed response: {error}"
                continue
        raise TeacherServerError(f"teacher server {self.settings.url}{path} failed {attempts} times; last: {last}")


def parse_prompt_logprobs(body: object, prompts: list[list[int]], starts: list[int], k: int, vocab_size: int) -> list[PositionLogProbs]:
    """The positions `starts[i]..len(prompts[i])-1` of each prompt from a /v1/completions answer."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        raise MalformedResponse("no 'choices' list")
    choices = body["choices"]
    if len(choices) != len(prompts):
        raise MalformedResponse(f"{len(choices)} choices for {len(prompts)} prompts")
    if all(isinstance(c, dict) and isinstance(c.get("index"), int) for c in choices):
        choices = sorted(choices, key=lambda c: c["index"])
    results = []
    for prompt, start, choice in zip(prompts, starts, choices):
        entries = choice.get("prompt_logprobs") if isinstance(choice, dict) else None
        if not isinstance(entries, list) or len(entries) != len(prompt):
            got = len(entries) if isinstance(entries, list) else type(entries).__name__
            raise MalformedResponse(f"prompt_logprobs has {got} entries for a prompt of {len(prompt)} tokens")
        ids = torch.empty(len(prompt) - start, k, dtype=torch.long)
        lps = torch.empty(len(prompt) - start, k, dtype=torch.float32)
        target = torch.empty(len(prompt) - start, dtype=torch.float32)
        for row, position in enumerate(range(start, len(prompt))):
            entry = entries[position]
            if not isinstance(entry, dict) or len(entry) < k:
                raise MalformedResponse(f"position {position}: expected at least {k} log-probs, got "
                                        f"{len(entry) if isinstance(entry, dict) else type(entry).__name__}")
            pairs = []
            for key, value in entry.items():
                try:
                    token = int(key)
                    logprob = float(value["logprob"] if isinstance(value, dict) else value)
                except (TypeError, ValueError, KeyError):
                    raise MalformedResponse(f"position {position}: entry {key!r}: {value!r} is not a token log-prob") from None
                if not 0 <= token < vocab_size:
                    raise MalformedResponse(f"position {position}: token id {token} outside the vocabulary [0, {vocab_size})")
                if not math.isfinite(logprob) or logprob > 1e-3:
                    raise MalformedResponse(f"position {position}: log-prob {logprob} of token {token} is not a finite number <= 0")
                pairs.append((min(logprob, 0.0), token))
            actual = prompt[position]
            found = [lp for lp, token in pairs if token == actual]
            if not found:
                raise MalformedResponse(f"position {position}: the log-prob of the token there ({actual}) is missing")
            pairs.sort(reverse=True)
            ids[row] = torch.tensor([token for _, token in pairs[:k]])
            lps[row] = torch.tensor([lp for lp, _ in pairs[:k]])
            target[row] = found[0]
        results.append(PositionLogProbs(ids, lps, target))
    return results


class ServerTeacher(Teacher):
    """Scores micro-batches through a completions server; gives a `SparseSignal` (tail derived from 1 - mass)."""

    can_generate = False
    frozen = True  # its weights never change during the run (`Teacher.frozen`)

    def __init__(self, settings: ServerSettings, vocab_size: int):
        if settings.top_k < 1 or settings.concurrency < 1 or settings.request_size < 1 or settings.retries < 0:
            raise ValueError("teacher_top_k, teacher_concurrency and teacher_request_size must be >= 1, teacher_retries >= 0")
        self.settings, self.vocab_size = settings, vocab_size
        self.model_name = settings.model
        self.client = CompletionsClient(settings)
        self.pool = ThreadPoolExecutor(max_workers=settings.concurrency, thread_name_prefix="teacher-http")
        self._images_checked: list = []  # the server said it reads images (`check_takes_images`)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    def check(self, tokenizer) -> None:
        """At set-up: the server answers and shares the student's tokenizer (the temperature: `check_temperature`)."""
        self.model_name = check_server(self.client, tokenizer, self.model_name)

    def check_temperature(self, temperature: float, probe_ids: list[int]) -> None:
        """A server that ignores `prompt_logprobs_temperature` (stock vLLM) would train at T=1 silently."""
        if temperature == 1.0:
            return
        if len(probe_ids) < 2:
            raise ValueError("the temperature probe needs a prompt of at least 2 tokens")
        at_one = self.prompt_logprobs([probe_ids], [1], 1.0)[0]
        at_t = self.prompt_logprobs([probe_ids], [1], temperature)[0]
        if torch.equal(at_one.log_probs, at_t.log_probs):
            raise ValueError(f"temperature: the teacher server returns the same prompt log-probs at temperature 1 and "
                             f"{temperature}; it ignores prompt_logprobs_temperature (stock vLLM computes prompt log-probs "
                             "from raw logits). Use temperature 1 with this server, or `distill serve-teacher`")

    def _model(self) -> dict:
        return {"model": self.model_name} if self.model_name else {}

    def prompt_logprobs(self, prompts: list[list[int]], starts: list[int], temperature: float,
                        requests: ScoreRequests | None = None) -> list[PositionLogProbs]:
        """Top-K log-probs at positions starts[i].. of each prompt, through concurrent requests (with the images
        of `requests`' rows, when they show any)."""
        k, size = self.settings.top_k, self.settings.request_size
        groups = [(prompts[i : i + size], starts[i : i + size], slice(i, i + size)) for i in range(0, len(prompts), size)]

        def send(group):
            group_prompts, group_starts, part = group
            payload = {"prompt": group_prompts, "max_tokens": 1, "prompt_logprobs": k, "temperature": temperature,
                       "prompt_logprobs_temperature": temperature, **self._model(),
                       **(requests.images_field(part) if requests is not None else {})}
            return self.client.request("POST", "/v1/completions", payload,
                                       parse=lambda body: parse_prompt_logprobs(body, group_prompts, group_starts, k, self.vocab_size))

        return [result for part in self.pool.map(send, groups) for result in part]

    def score(self, batch: MicroBatch, temperature: float) -> SparseSignal:
        return self.score_many([batch], temperature)[0]

    def score_many(self, batches: list[MicroBatch], temperature: float) -> list[SparseSignal]:
        """All micro-batches of a step in one concurrent round of requests; one signal per micro-batch."""
        requests = completion_prompts(batches)
        check_takes_images(self.client, requests, self._images_checked)
        answers = self.prompt_logprobs(requests.prompts, requests.starts, temperature, requests) if requests.prompts else []
        results = iter([PositionLogProbs(requests.select(i, r.ids), requests.select(i, r.log_probs),
                                         requests.select(i, r.target_log_probs)) for i, r in enumerate(answers)])
        k, signals = self.settings.top_k, []
        for batch in batches:
            parts = [next(results) for c in batch.completions if c.num_trained]
            ids = torch.cat([r.ids for r in parts]) if parts else torch.empty(0, k, dtype=torch.long)
            lps = torch.cat([r.log_probs for r in parts]) if parts else torch.empty(0, k)
            target = torch.cat([r.target_log_probs for r in parts]) if parts else torch.empty(0)
            if ids.shape[0] != batch.num_completion_tokens:
                raise TeacherServerError(f"the server scored {ids.shape[0]} positions for {batch.num_completion_tokens} completion tokens")
            signals.append(SparseSignal(ids, lps, target, None, temperature))
        return signals


def check_server(client: CompletionsClient, tokenizer, model_name: str | None) -> str | None:
    """The server answers and tokenizes a probe as the student's tokenizer does; returns the model name to send
    (the server's first model when `model_name` is None: older vLLM versions require one)."""
    client.request("GET", "/health")
    if model_name is None:
        model_name = client.request(
            "GET", "/v1/models", parse=lambda b: b["data"][0]["id"] if isinstance(b, dict) and b.get("data") else _bad("data"))
    probe = ("The quick brown fox explains photosynthesis, gravity and the largest planet in 12345 words; "
             "Größe, café, naïve, 東京, ありがとう, 🙂 <|im_end|>\n<|im_start|>assistant\n")
    named = {"model": model_name} if model_name else {}
    served = client.request("POST", "/tokenize", {"prompt": probe, "add_special_tokens": False, **named},
                            parse=lambda b: b["tokens"] if isinstance(b, dict) and isinstance(b.get("tokens"), list) else _bad("tokens"))
    local = tokenizer(probe, add_special_tokens=False)["input_ids"]
    if served != local:
        raise ValueError(f"teacher_url: the server's tokenizer differs from the student's (probe {probe!r}: server {served}, "
                         f"student {local}); a server teacher needs the same tokenizer (cross-tokenizer: method gold)")
    return model_name


@dataclass
class ScoreRequests:
    """What a server scores for a step's micro-batches: one prompt per completion with tokens trained on, in
    the row-major order of the micro-batches' trained positions (`MicroBatch`).

    prompts[i]: prompt + completion ids; starts[i]: the index of its first trained token (the server answers
    every position from there to the end); picks[i]: the answered rows that are trained, as indices counted
    from starts[i] (all of them unless the trained mask has holes: the tokens in a hole, an environment's
    turn, are scored and dropped here). A completion without a trained token has nothing to score.
    """

    prompts: list[list[int]]
    starts: list[int]
    picks: list[torch.Tensor]
    images: list[tuple[ImageRef, ...]] = field(default_factory=list)  # per prompt, the images its row shows

    def images_field(self, part: slice) -> dict:
        """The request field carrying the images of prompts `part` (base64 PNG, `distill_images`), or none."""
        rows = self.images[part]
        if not any(rows):
            return {}
        return {IMAGES_FIELD: [[encode_png(image.load()) for image in row] for row in rows]}

    def select(self, index: int, rows: torch.Tensor) -> torch.Tensor:
        """The trained rows of prompt `index`'s answer `rows` (its positions starts[index] .. end)."""
        picks = self.picks[index]
        return rows if picks.numel() == rows.shape[0] else rows[picks.to(rows.device)]


def completion_prompts(batches: list[MicroBatch]) -> ScoreRequests:
    """`ScoreRequests` for every completion of `batches` with tokens trained on."""
    prompts, starts, picks, images = [], [], [], []
    for batch in batches:
        for completion in batch.completions:
            trained = completion.trained_indices()
            if trained:
                prompts.append(completion.prompt_ids + completion.completion_ids)
                starts.append(len(completion.prompt_ids) + trained[0])
                picks.append(torch.tensor(trained, dtype=torch.long) - trained[0])
                images.append(completion.example.images if completion.example is not None else ())
    return ScoreRequests(prompts, starts, picks, images)


def check_takes_images(client: CompletionsClient, requests: ScoreRequests, checked: list) -> None:
    """Before the first request with images: the server must say it reads them (`distill serve-teacher` with a
    vision-language model); stock vLLM's /v1/completions takes token ids only and would ignore the field."""
    if checked or not any(requests.images):
        return
    try:
        info = client.request("GET", "/distill/v1/info")
    except Exception:  # not distill's server
        info = {}
    if not (isinstance(info, dict) and info.get("images") is True):
        raise ValueError("teacher_url: rows show images, and this server takes none: stock vLLM's /v1/completions scores "
                         "token ids only (vLLM 0.32 has no image field there), and a `distill serve-teacher` of a text-only "
                         "model has no processor. Serve the vision-language teacher with `distill serve-teacher`")
    checked.append(True)


def _bad(what: str):
    raise MalformedResponse(f"no '{what}' in the answer")
