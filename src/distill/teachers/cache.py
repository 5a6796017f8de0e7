"""Offline teacher caches: sparse teacher log-probs of a dataset's completions, on disk.

Layout of a cache directory (format "distill-teacher-cache", version 1):

    manifest.json             settings (teacher, tokenizer hash, vocabulary, K, temperature, prompt and
                              completion lengths, where completions came from), and one entry per shard:
                              file, first example, examples, tokens, bytes, sha256
    shard-00000.safetensors   examples [0, S), S = shard_size, in dataset order
    shard-00001.safetensors   ...

Each shard is a safetensors file (plain numpy arrays, little-endian) holding, for its E examples and their
T completion tokens in total:

    example_ids     (E,)      int64    the example's row index in the dataset split ("example id")
    prompt_crc      (E,)      int64    CRC-32 of the prompt token ids the teacher saw (catches another dataset)
    offsets         (E + 1,)  int64    example e's tokens are rows offsets[e]:offsets[e+1]
    tokens          (T, b)    uint8    completion token ids, b-byte little-endian (b = id_bytes)
    topk_ids        (T, K, b) uint8    the teacher's top-K token ids, in decreasing probability
    topk_logprobs   (T, K)    float16  their log-probs at `temperature`
    token_logprobs  (T,)      float16  the log-prob of the completion token itself
    tail_logprobs   (T,)      float16  log of the mass outside top-K and the completion token

A cache of the hidden-state payload (`cache-teacher --payload hidden`, manifest `payload: "hidden"`) holds
instead of the four top-k arrays the teacher's final hidden states at each completion token's predicting
position, in the manifest's `hidden_dtype`, and the teacher's lm_head once (`head.safetensors`, float32,
`distill.teachers.head`), whose fingerprint the manifest records (`head_sha256`) and the reader verifies:

    hidden          (T, H)    float32  (hidden_dtype float32: exact)
    hidden_bf16     (T, H)    int16    (bfloat16: the states' bfloat16 bits, 2H bytes per token)
    hidden_int8     (T, H)    int8     (int8: round(h / s) with s = max |h| / 127 per token,
    hidden_scale    (T,)      float32   H + 4 bytes per token)

Hidden states hold no temperature: the loss applies the run's, exactly, so such a cache serves any
temperature and any K. The manifest's `top_k` and `temperature` are null.

The arrays cover every completion token, trained or not: a run picks the rows its trained mask keeps
(`Completion.trained_mask`), so one cache serves any mask (leading tokens skipped, a trajectory's holes).

`id_bytes` is 2 when the vocabulary fits in 16 bits, else 3 (24 bits; 16.7M ids). Per token that is
K (b + 2) + b + 4 bytes: 4K + 6 with b = 2 (86 bytes at K = 20), 5K + 7 with b = 3, within 6K + 4 for
every K >= 3. Each file adds a small header and 16 bytes per example (ids, offsets, prompt CRC);
the manifest reports both `token_bytes_per_token` (the arrays above) and `bytes_per_token` (whole files).
Log-probs in float16 keep ~3 significant digits (an error of ~0.004 nats at -10).

Shards are written to a temporary name and renamed, and the manifest is rewritten after each shard, so an
interrupted `cache-teacher` resumes by skipping shards whose checksum matches; a shard whose bytes do not
match its checksum is detected when the cache is opened (and rewritten by re-running `cache-teacher`).

The cache's own files, the only ones `cache-teacher --overwrite` deletes (`cache_files`): manifest.json of this
format, shard-NNNNN.safetensors files holding exactly the arrays above (of one payload), head.safetensors holding a
teacher head, and the temporary files .manifest.json.tmp, .shard-NNNNN.safetensors.tmp and .head.safetensors.tmp. A file with one of these names but other contents (a
user's manifest.json, say) is never deleted: it stops `--overwrite` with its name instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

FORMAT = "distill-teacher-cache"
VERSION = 1
MANIFEST = "manifest.json"
HEAD_FILE = "head.safetensors"
EXAMPLE_ARRAYS = ("example_ids", "prompt_crc", "offsets", "tokens")
TOPK_ARRAYS = ("topk_ids", "topk_logprobs", "token_logprobs", "tail_logprobs")
HIDDEN_ARRAYS = {"float32": ("hidden",), "bfloat16": ("hidden_bf16",), "int8": ("hidden_int8", "hidden_scale")}
SHARD_ARRAYS = frozenset((*EXAMPLE_ARRAYS, *TOPK_ARRAYS))
SHARD_ARRAY_SETS = (SHARD_ARRAYS, *(frozenset((*EXAMPLE_ARRAYS, *names)) for names in HIDDEN_ARRAYS.values()))
_SHARD_NAME = re.compile(r"shard-\d{5,}\.safetensors")
_TEMPORARY_NAME = re.compile(r"\.(shard-\d{5,}\.safetensors|manifest\.json|head\.safetensors)\.tmp")
# Settings that must agree between a cache and the run (or the cache-teacher re-run) that uses it.
SETTING_KEYS = ("teacher", "tokenizer_hash", "vocab_size", "top_k", "temperature", "max_prompt_length", "max_new_tokens",
                "completions", "dataset", "split", "shard_size", "num_examples", "seed", "payload", "hidden_dtype", "head_sha256")


def tokenizer_hash(tokenizer) -> str:
    """SHA-256 of the vocabulary (token -> id) and the special tokens: equal for interchangeable tokenizers."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = sorted(str(t) for t in getattr(tokenizer, "all_special_tokens", []))
    return hashlib.sha256(json.dumps([vocab, special], ensure_ascii=False).encode()).hexdigest()


def prompt_crc(prompt_ids: list[int]) -> int:
    return zlib.crc32(np.asarray(prompt_ids, dtype="<i8").tobytes())


def id_bytes_for(vocab_size: int) -> int:
    if vocab_size <= 1 << 16:
        return 2
    if vocab_size <= 1 << 24:
        return 3
    raise ValueError(f"vocabulary of {vocab_size} tokens is too large for the cache format (at most 2^24)")


def pack_ids(ids: np.ndarray, nbytes: int) -> np.ndarray:
    """Integer array (...,) -> uint8 (..., nbytes), little-endian."""
    return ids.astype("<u4").view(np.uint8).reshape(*ids.shape, 4)[..., :nbytes].copy()


def unpack_ids(packed: np.ndarray) -> np.ndarray:
    """uint8 (..., nbytes) -> int64 (...,)."""
    padded = np.zeros((*packed.shape[:-1], 4), dtype=np.uint8)
    padded[..., : packed.shape[-1]] = packed
    return padded.view("<u4")[..., 0].astype(np.int64)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def is_cache_manifest(path: Path) -> bool:
    """A manifest.json that cache-teacher wrote (a JSON object of this format), not a user's file of that name."""
    try:
        manifest = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def is_cache_shard(path: Path) -> bool:
    """A safetensors file holding exactly a shard's arrays (checked from its header, the data is not read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return set(handle.keys()) in SHARD_ARRAY_SETS
    except (SafetensorError, OSError, ValueError):  # not safetensors at all, or unreadable
        return False


def is_cache_head(path: Path) -> bool:
    """A safetensors file holding a teacher head (`distill.teachers.head`, checked from its header)."""
    from safetensors import SafetensorError, safe_open

    from distill.teachers.head import HEAD_FORMAT

    try:
        with safe_open(str(path), framework="numpy") as handle:
            return (handle.metadata() or {}).get("format") == HEAD_FORMAT
    except (SafetensorError, OSError, ValueError):
        return False


def _starts_like_safetensors(path: Path) -> bool:
    """The first bytes are a safetensors header's (a length, then '{'): a truncated shard, not a user's file."""
    with open(path, "rb") as handle:
        head = handle.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < 1 << 30


def cache_files(directory: Path) -> tuple[list[Path], list[Path]]:
    """(the cache's own files in `directory`, files named like them that are not the cache's).

    Own: manifest.json of this format, shard-NNNNN.safetensors with a shard's arrays, or listed in that
    manifest and starting like a safetensors file (a truncated shard is still the cache's; a user's file that
    took the name is not), and the temporary files .manifest.json.tmp /
    .shard-NNNNN.safetensors.tmp (possibly half-written, so judged by name). Only the first list is ever
    deleted; the second names what a user must move before the directory can be rebuilt.
    """
    own, foreign = [], []
    manifest = Path(directory) / MANIFEST
    listed = set()
    if manifest.is_file() and is_cache_manifest(manifest):
        listed = {entry.get("file") for entry in json.loads(manifest.read_text()).get("shards", []) if isinstance(entry, dict)}
    for path in sorted(Path(directory).iterdir()):
        name = path.name
        if name == MANIFEST:
            (own if path.is_file() and is_cache_manifest(path) else foreign).append(path)
        elif _SHARD_NAME.fullmatch(name):
            (own if path.is_file() and ((name in listed and _starts_like_safetensors(path)) or is_cache_shard(path))
             else foreign).append(path)
        elif name == HEAD_FILE:
            (own if path.is_file() and is_cache_head(path) else foreign).append(path)
        elif _TEMPORARY_NAME.fullmatch(name):
            (own if path.is_file() else foreign).append(path)
    return own, foreign


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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


def quantize_hidden(hidden: torch.Tensor, dtype: str) -> dict[str, np.ndarray]:
    """A shard's hidden-state arrays for (T, H) float32 states in `dtype` (module docstring)."""
    hidden = hidden.detach().to("cpu", torch.float32).contiguous()
    if dtype == "float32":
        return {"hidden": hidden.numpy()}
    if dtype == "bfloat16":
        return {"hidden_bf16": hidden.to(torch.bfloat16).view(torch.int16).numpy()}
    if dtype == "int8":
        scale = hidden.abs().amax(dim=1) / 127.0
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return {"hidden_int8": (hidden / scale[:, None]).round().clamp(-127, 127).to(torch.int8).numpy(),
                "hidden_scale": scale.numpy()}
    raise ValueError(f"hidden dtype must be one of {sorted(HIDDEN_ARRAYS)}, got {dtype!r}")


def dequantize_hidden(arrays: dict[str, np.ndarray], dtype: str) -> torch.Tensor:
    """(T, H) float32 from `quantize_hidden`'s arrays."""
    if dtype == "float32":
        return torch.from_numpy(np.ascontiguousarray(arrays["hidden"], dtype=np.float32))
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arrays["hidden_bf16"])).view(torch.bfloat16).float()
    scale = torch.from_numpy(np.ascontiguousarray(arrays["hidden_scale"], dtype=np.float32))
    return torch.from_numpy(np.ascontiguousarray(arrays["hidden_int8"])).float() * scale[:, None]


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
    arrays = records.arrays(id_bytes, *hidden) if hidden is not None else records.arrays(id_bytes, k)
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


WRITE_COMMAND = "distill cache-teacher --teacher MODEL --dataset DATASET --top-k K --out {directory}"
ONLY_CACHE_FILES = ("it deletes only the cache's own files: manifest.json, shard-NNNNN.safetensors and their "
                    "temporary files, never other files")


def missing_manifest_advice(directory: Path) -> str:
    """What to run for a `directory` without a manifest, which `cache-teacher` then accepts (`_check_out`):
    plain when it is absent or empty, with --overwrite when it holds cache files or others (never deleted),
    and moving the files named like the cache's that are not its."""
    command = WRITE_COMMAND.format(directory=directory)
    if not directory.is_dir() or not any(directory.iterdir()):
        return f"write it with `{command}`"
    foreign = cache_files(directory)[1]
    if foreign:
        return (f"it holds {', '.join(p.name for p in foreign)}, named like a cache's files but not written by cache-teacher: "
                f"move them away (or choose another directory), then write the cache with `{command} --overwrite`")
    return f"rebuild it with `{command} --overwrite` ({ONLY_CACHE_FILES})"


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
