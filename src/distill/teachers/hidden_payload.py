"""The hidden-state payload: a teacher's final hidden states on the wire (and its request), one format for
`distill serve-teacher` and its client.

    GET  /distill/v1/info           -> {"format", "version", "model", "hidden_size", "vocab_size", "head_sha256",
                                        "dtypes", "max_model_len"}
    GET  /distill/v1/head           -> the teacher's lm_head as a safetensors file (`distill.teachers.head`)
    POST /distill/v1/hidden_states  {"model": name, "prompts": [[ids], ...], "starts": [s, ...], "dtype": "float32"}
        -> a safetensors file (application/octet-stream): `hidden` (R, H) in the asked dtype, the states after
           the final norm at the positions predicting tokens s..len-1 of each prompt (len - s rows per prompt,
           prompt after prompt), `counts` (P,) int64 the rows per prompt; metadata: the head's fingerprint.

Why safetensors and not JSON: H numbers per token are the payload (576 for the default teacher), and JSON
would spell each float in ~10 characters (or base64 a third larger than the bytes) and parse them one by one
in Python; a safetensors body is the raw little-endian array behind a small header that states each tensor's
dtype and shape, so the client checks them before reading the data and loads it without a copy. bfloat16
halves the bytes for a loss that is computed in float32 anyway (the error it costs: `benchmarks/hidden.py`).
"""

from __future__ import annotations

import json

import torch

PAYLOAD_FORMAT = "distill-hidden-states"
PAYLOAD_VERSION = 1
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CONTENT_TYPE = "application/octet-stream"


def encode_hidden(hidden: torch.Tensor, counts: list[int], head_sha256: str) -> bytes:
    """A response body: `hidden` (R, H) as given (float32 or bfloat16), `counts` (P,)."""
    from safetensors.torch import save

    return save({"hidden": hidden.contiguous().cpu(), "counts": torch.tensor(counts, dtype=torch.int64)},
                metadata={"format": PAYLOAD_FORMAT, "head_sha256": head_sha256})


def decode_hidden(data: bytes, counts: list[int], hidden_size: int, head_sha256: str) -> torch.Tensor:
    """(sum(counts), H) float32 from a response body; ValueError saying what does not match what was asked:
    another format, another head, a count or width that is not the request's, a value that is not finite."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + length]) if 0 < length <= len(data) - 8 else None
        tensors = load(data) if header is not None else None
    except (SafetensorError, ValueError) as error:
        raise ValueError(f"the hidden-state payload is not a safetensors file: {error}") from None
    if header is None or tensors is None:
        raise ValueError("the hidden-state payload is not a safetensors file (no header)")
    metadata = header.get("__metadata__") or {}
    if metadata.get("format") != PAYLOAD_FORMAT or set(tensors) != {"hidden", "counts"}:
        raise ValueError(f"the hidden-state payload has format {metadata.get('format')!r} and tensors {sorted(tensors)}, "
                         f"not {PAYLOAD_FORMAT} with hidden and counts")
    if metadata.get("head_sha256") != head_sha256:
        raise ValueError("the hidden states come from a teacher whose head differs from the one loaded at start "
                         f"({metadata.get('head_sha256')} vs {head_sha256}): the server's model changed; restart the run")
    hidden, got = tensors["hidden"], tensors["counts"].tolist()
    if got != list(counts):
        raise ValueError(f"the hidden-state payload has {got} rows per prompt, the request asked for {list(counts)}")
    if hidden.dim() != 2 or hidden.shape != (sum(counts), hidden_size):
        raise ValueError(f"the hidden-state payload is {tuple(hidden.shape)}, expected ({sum(counts)}, {hidden_size}): "
                         "a teacher of another width than its head")
    if hidden.dtype not in DTYPES.values():
        raise ValueError(f"the hidden-state payload is {hidden.dtype}, not float32 or bfloat16")
    hidden = hidden.float()
    if not torch.isfinite(hidden).all():
        raise ValueError("the hidden-state payload holds non-finite values")
    return hidden


def check_hidden_request(body: dict, vocab_size: int, max_prompt_tokens: int, max_model_len: int | None
                         ) -> tuple[list[list[int]], list[int], str]:
    """Validate a /distill/v1/hidden_states body; (prompts, starts, dtype name) or ValueError with the reason
    (the server answers it as a 400)."""
    prompts, starts, dtype = body.get("prompts"), body.get("starts"), body.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, list) for p in prompts):
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if not isinstance(starts, list) or len(starts) != len(prompts):
        raise ValueError(f"starts must be a list of {len(prompts)} integers, one per prompt")
    total = 0
    for index, (prompt, start) in enumerate(zip(prompts, starts)):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size for t in prompt):
            raise ValueError(f"prompt {index}: every prompt must be a non-empty list of token ids in [0, {vocab_size})")
        if not isinstance(start, int) or isinstance(start, bool) or not 1 <= start <= len(prompt):
            raise ValueError(f"starts[{index}] must be an integer in [1, {len(prompt)}] (the first token whose predicting "
                             f"position is returned), got {start!r}")
        total += len(prompt)
        if total > max_prompt_tokens:
            raise ValueError(f"the request holds more than {max_prompt_tokens} prompt tokens, this server's limit per "
                             "request: split it into smaller requests, or start serve-teacher with --max-prompt-tokens N")
        if max_model_len is not None and len(prompt) > max_model_len:
            raise ValueError(f"prompt {index} has {len(prompt)} tokens, more than the model's context of {max_model_len}")
    return prompts, starts, dtype
