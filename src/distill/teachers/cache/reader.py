"""Reading an offline teacher cache: the manifest checked, every shard's checksum verified on opening, examples
served by id with only their rows read from disk. The format: `format.py`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distill.teachers.cache.format import (
    FORMAT,
    HEAD_FILE,
    HIDDEN_ARRAYS,
    MANIFEST,
    VERSION,
    dequantize_hidden,
    missing_manifest_advice,
    sha256_file,
    tokenizer_hash,
    unpack_ids,
)


@dataclass
class CachedExample:
    """One example's cached teacher signal: tokens (L,) long; topk_ids (L, K) long; topk_logprobs (L, K),
    token_logprobs (L,), tail_logprobs (L,) float32."""

    tokens: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    token_logprobs: torch.Tensor
    tail_logprobs: torch.Tensor
    prompt_crc: int


@dataclass
class CachedHidden:
    """One example of a hidden-payload cache: tokens (L,) long; hidden (L, H) float32 (dequantised)."""

    tokens: torch.Tensor
    hidden: torch.Tensor
    prompt_crc: int


def read_manifest(directory: Path) -> dict:
    directory = Path(directory)
    path = directory / MANIFEST
    if not path.is_file():
        state = "does not exist" if not directory.exists() else f"has no {MANIFEST} (deleted, or not a cache)"
        raise ValueError(f"teacher_cache: {directory} {state}; {missing_manifest_advice(directory)}")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ValueError(f"teacher_cache: {directory} is not a {FORMAT} v{VERSION} directory")
    return manifest


class TeacherCache:
    """Read side: verifies every shard's checksum on opening, then serves examples by example id.

    Only the small per-example arrays (ids, offsets, prompt CRCs) are held in memory; an example's per-token
    rows are sliced out of its shard on demand (safetensors reads just those bytes), so a cache much larger than
    memory works, on every process.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        if not self.manifest.get("complete"):
            raise ValueError(f"teacher_cache: {self.directory} is incomplete (cache-teacher was interrupted); re-run the "
                             "same `distill cache-teacher` command to finish it")
        self.location: dict[int, tuple[int, int]] = {}
        self._index: list[dict[str, np.ndarray]] = []
        self._handles: dict[int, object] = {}
        for number, entry in enumerate(self.manifest["shards"]):
            path = self.directory / entry["file"]
            if not path.is_file() or sha256_file(path) != entry["sha256"]:
                raise ValueError(f"teacher_cache: shard {path} is missing or corrupt (checksum mismatch); re-run the same "
                                 "`distill cache-teacher` command to rewrite it")
            handle = self._handle(number)
            self._index.append({name: handle.get_tensor(name) for name in ("example_ids", "offsets", "prompt_crc")})
            for local, example_id in enumerate(self._index[number]["example_ids"].tolist()):
                self.location[example_id] = (number, local)
        self.head = self._read_head() if self.payload == "hidden" else None

    @property
    def payload(self) -> str:
        """"topk" (sparse log-probs) or "hidden" (final hidden states and the teacher's head)."""
        return self.manifest.get("payload", "topk")

    def _read_head(self):
        from distill.teachers.head import head_fingerprint, head_from_bytes

        path = self.directory / HEAD_FILE
        if not path.is_file():
            raise ValueError(f"teacher_cache: {path} is missing (a hidden-payload cache holds the teacher's head); re-run "
                             "the same `distill cache-teacher` command to rewrite it")
        head = head_from_bytes(path.read_bytes(), f"teacher_cache: {path}")
        if head_fingerprint(head) != self.manifest.get("head_sha256"):
            raise ValueError(f"teacher_cache: {path} is not the head of the teacher that wrote the cache's hidden states "
                             "(fingerprint mismatch); re-run the same `distill cache-teacher` command with --overwrite")
        return head

    @property
    def top_k(self) -> int:
        return int(self.manifest["top_k"])

    @property
    def temperature(self) -> float:
        return float(self.manifest["temperature"])

    def _handle(self, number: int):
        if number not in self._handles:
            from safetensors import safe_open

            self._handles[number] = safe_open(str(self.directory / self.manifest["shards"][number]["file"]), framework="numpy")
        return self._handles[number]

    def __contains__(self, example_id: int) -> bool:
        return example_id in self.location

    def get(self, example_id: int) -> CachedExample | CachedHidden:
        if example_id not in self.location:
            raise KeyError(f"teacher_cache {self.directory} has no example {example_id}")
        number, local = self.location[example_id]
        index, handle = self._index[number], self._handle(number)
        lo, hi = int(index["offsets"][local]), int(index["offsets"][local + 1])
        rows = lambda name: handle.get_slice(name)[lo:hi]  # noqa: E731
        if self.payload == "hidden":
            dtype = self.manifest["hidden_dtype"]
            hidden = dequantize_hidden({name: rows(name) for name in HIDDEN_ARRAYS[dtype]}, dtype)
            return CachedHidden(torch.from_numpy(unpack_ids(rows("tokens"))), hidden, int(index["prompt_crc"][local]))
        as_float = lambda name: torch.from_numpy(np.ascontiguousarray(rows(name), dtype=np.float32))  # noqa: E731
        return CachedExample(
            torch.from_numpy(unpack_ids(rows("tokens"))), torch.from_numpy(unpack_ids(rows("topk_ids"))),
            as_float("topk_logprobs"), as_float("token_logprobs"), as_float("tail_logprobs"), int(index["prompt_crc"][local]),
        )

    def check_run(self, tokenizer, top_k: int, temperature: float, max_prompt_length: int, max_new_tokens: int,
                  payload: str = "topk") -> None:
        """Reject a cache of another payload, or made with another tokenizer, K, temperature (top-k log-probs
        only: hidden states serve any), prompt or completion budget than the run asks for."""
        if payload != self.payload:
            raise ValueError(f"teacher_cache {self.directory} holds {'hidden states' if self.payload == 'hidden' else 'top-k log-probs'}: "
                             f"set teacher_payload: {self.payload}")
        wanted = {"tokenizer_hash": tokenizer_hash(tokenizer), "max_prompt_length": max_prompt_length,
                  "max_new_tokens": max_new_tokens}
        if payload == "topk":
            wanted.update(top_k=top_k, temperature=temperature)
        fixes = {"tokenizer_hash": "use the student tokenizer the cache was made for, or re-cache with it",
                 "top_k": "set teacher_logprobs to the cache's K", "temperature": "set temperature to the cache's",
                 "max_prompt_length": "set max_prompt_length to the cache's",
                 "max_new_tokens": "set max_new_tokens to the cache's (its completions are what the run trains on)"}
        for key, value in wanted.items():
            have = self.manifest[key]
            if (abs(have - value) > 1e-9 if isinstance(value, float) else have != value):
                shown = "another tokenizer" if key == "tokenizer_hash" else f"{key} {have}"
                raise ValueError(f"teacher_cache {self.directory} was made with {shown}, the run asks for "
                                 f"{'this one' if key == 'tokenizer_hash' else value}: {fixes[key]}")
