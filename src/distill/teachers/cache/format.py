"""The on-disk format of an offline teacher cache (`distill cache-teacher`): what its files hold, how ids and hidden
states are packed, which files in a directory are the cache's own. The writer (`writer.py`) and the reader
(`reader.py`) both follow it.

Offline teacher caches: sparse teacher log-probs of a dataset's completions, on disk.

Layout of a cache directory (format "distill-teacher-cache", version 1):

    manifest.json             settings (teacher, tokenizer hash, vocabulary, K, temperature, prompt and
                              completion lengths, where completions came from), and one entry per shard:
                              file, first example, examples, tokens, bytes, sha256
    shard-00000.safetensors   examples [0, S), S = shard_size, in dataset order
    shard-00001.safetensors   ...

Each shard is a safetensors file (plain numpy arrays, little-endian) holding, for its E examples and their
T completion tokens in total:

    example_ids     (E,)      int64    the example's row index in the dataset split ("example id")
    prompt_crc      (E,)      int64    CRC-32 of the prompt token ids the teacher saw (catches another dataset),
                                       chained with the digest of each image the prompt shows (`prompt_crc`)
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
import re
import zlib
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


def prompt_crc(prompt_ids: list[int], images: tuple = ()) -> int:
    """CRC-32 of the prompt the teacher saw: its token ids, then each image's pixel digest (`ImageRef.digest`), so a
    row whose image changed (its placeholder tokens depend on its size only) no longer matches. Without images:
    the ids' CRC, as caches without images always had."""
    crc = zlib.crc32(np.asarray(prompt_ids, dtype="<i8").tobytes())
    for image in images:
        crc = zlib.crc32(bytes.fromhex(image.digest()), crc)
    return crc


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
    own: list[Path] = []
    foreign: list[Path] = []
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


