"""Writing an offline teacher cache (`distill cache-teacher`): a shard's records, written atomically (a temporary
name, then a rename), the teacher head of a hidden-payload cache, and the manifest (rewritten after each shard,
so an interrupted run resumes). The format: `format.py`."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distill.teachers.cache.format import HEAD_FILE, MANIFEST, pack_ids, quantize_hidden, sha256_file, shard_name


def example_arrays(example_ids: list[int], prompt_crcs: list[int], tokens: list[np.ndarray], id_bytes: int) -> dict[str, np.ndarray]:
    """A shard's per-example arrays and its completion tokens, whatever its payload."""
    flat = np.concatenate(tokens).astype(np.int64) if tokens else np.zeros((0,), np.int64)
    return {"example_ids": np.asarray(example_ids, dtype=np.int64), "prompt_crc": np.asarray(prompt_crcs, dtype=np.int64),
            "offsets": np.concatenate([[0], np.cumsum([len(t) for t in tokens])]).astype(np.int64),
            "tokens": pack_ids(flat, id_bytes)}


@dataclass
class ShardRecords:
    """What a shard writer collects before writing: one entry per example, in order."""

    example_ids: list[int]
    prompt_crcs: list[int]
    tokens: list[np.ndarray]
    topk_ids: list[np.ndarray]
    topk_logprobs: list[np.ndarray]
    token_logprobs: list[np.ndarray]
    tail_logprobs: list[np.ndarray]

    @classmethod
    def empty(cls) -> "ShardRecords":
        return cls([], [], [], [], [], [], [])

    def add(self, example_id: int, crc: int, tokens, topk_ids, topk_logprobs, token_logprobs, tail_logprobs) -> None:
        self.example_ids.append(example_id)
        self.prompt_crcs.append(crc)
        for name, value in (("tokens", tokens), ("topk_ids", topk_ids), ("topk_logprobs", topk_logprobs),
                            ("token_logprobs", token_logprobs), ("tail_logprobs", tail_logprobs)):
            getattr(self, name).append(np.asarray(value))

    def arrays(self, id_bytes: int, k: int) -> dict[str, np.ndarray]:
        cat = lambda parts, shape, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)  # noqa: E731
        return {
            **example_arrays(self.example_ids, self.prompt_crcs, self.tokens, id_bytes),
            "topk_ids": pack_ids(cat(self.topk_ids, (0, k), np.int64), id_bytes),
            "topk_logprobs": cat(self.topk_logprobs, (0, k), np.float16),
            "token_logprobs": cat(self.token_logprobs, (0,), np.float16),
            "tail_logprobs": cat(self.tail_logprobs, (0,), np.float16),
        }


@dataclass
class HiddenShardRecords:
    """What a hidden-payload shard writer collects: per example its id, prompt CRC, tokens (L,) and states (L, H)."""

    example_ids: list[int]
    prompt_crcs: list[int]
    tokens: list[np.ndarray]
    hidden: list[torch.Tensor]

    @classmethod
    def empty(cls) -> "HiddenShardRecords":
        return cls([], [], [], [])

    def add(self, example_id: int, crc: int, tokens, hidden: torch.Tensor) -> None:
        self.example_ids.append(example_id)
        self.prompt_crcs.append(crc)
        self.tokens.append(np.asarray(tokens))
        self.hidden.append(hidden.detach().to("cpu", torch.float32))

    def arrays(self, id_bytes: int, dtype: str, hidden_size: int) -> dict[str, np.ndarray]:
        states = torch.cat(self.hidden) if self.hidden else torch.zeros(0, hidden_size)
        return {**example_arrays(self.example_ids, self.prompt_crcs, self.tokens, id_bytes), **quantize_hidden(states, dtype)}


def write_shard(directory: Path, index: int, records: ShardRecords | HiddenShardRecords, id_bytes: int, k: int | None,
                hidden: tuple[str, int] | None = None) -> dict:
    """Write shard `index` atomically; returns its manifest entry. `hidden`: (dtype, H) for a hidden-payload shard."""
    from safetensors.numpy import save_file

    name = shard_name(index)
    if hidden is not None:
        assert isinstance(records, HiddenShardRecords)  # a hidden-payload shard's
        arrays = records.arrays(id_bytes, *hidden)
    else:
        assert isinstance(records, ShardRecords) and k is not None  # a top-k shard's, with its k
        arrays = records.arrays(id_bytes, k)
    temporary = directory / f".{name}.tmp"
    save_file(arrays, str(temporary))
    os.replace(temporary, directory / name)
    per_token = [n for n in arrays if n not in ("example_ids", "prompt_crc", "offsets")]
    return {"file": name, "first": int(records.example_ids[0]) if records.example_ids else None,
            "examples": len(records.example_ids), "tokens": int(arrays["offsets"][-1]),
            "token_bytes": int(sum(arrays[n].nbytes for n in per_token)),
            "bytes": (directory / name).stat().st_size, "sha256": sha256_file(directory / name)}


def write_head(directory: Path, head) -> dict:
    """The teacher head of a hidden-payload cache, written atomically; returns its manifest entry."""
    from distill.teachers.head import head_bytes

    temporary = directory / f".{HEAD_FILE}.tmp"
    temporary.write_bytes(head_bytes(head))
    os.replace(temporary, directory / HEAD_FILE)
    return {"file": HEAD_FILE, "bytes": (directory / HEAD_FILE).stat().st_size, "sha256": sha256_file(directory / HEAD_FILE)}


def write_manifest(directory: Path, manifest: dict) -> None:
    temporary = directory / f".{MANIFEST}.tmp"
    temporary.write_text(json.dumps(manifest, indent=2))
    os.replace(temporary, directory / MANIFEST)


