"""Per-row sampling seeds: one integer per completion, derived from what identifies the row.

An engine with a sampler of its own (vLLM) draws each row from its own seed. Deriving the seed from
(run seed, purpose, step, process, row) instead of drawing it from an RNG gives two guarantees without any
state to checkpoint: identical prompts in one batch (sdpo's groups, a repeated prompt) get different
samples, and a resumed run draws exactly the samples an uninterrupted one drew. The built-in engines sample
on torch's process RNG instead, which the run seeds and checkpoints, with the same two guarantees.
"""

from __future__ import annotations

import hashlib

SEED_BITS = 63  # vLLM seeds a torch.Generator per request: any non-negative int64


def row_seed(*key: int | str) -> int:
    """A seed in [0, 2**63) that depends on every part of `key` and on nothing else (not on the Python
    process's hash seed, not on the platform)."""
    digest = hashlib.blake2b(repr(tuple(key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << SEED_BITS) - 1)


def row_seeds(count: int, *key: int | str) -> list[int]:
    """`row_seed(*key, row)` for rows 0..count-1."""
    return [row_seed(*key, row) for row in range(count)]


def teacher_window_seed(seed: int, first_step: int, process_index: int) -> int:
    """The torch seed the seq_kd teacher samples its window of steps from `first_step` with on process
    `process_index` (its own RNG: the process RNG the student samples on is untouched). One integer per (run seed,
    window, process), so a run resumed inside a window samples the window again alike; the two primes keep windows
    and processes of nearby run seeds apart."""
    return seed * 1_000_003 + first_step + 104_729 * (process_index + 1)
