"""Every seed a run derives, one named stream each: what each random choice draws from, and why it is its own.

A run has one `seed`. Each random choice it makes draws from a stream derived from that seed and from what
identifies the choice (the step, the epoch, the process, the shard, the row), never from a shared RNG's position,
so a resumed run draws exactly what an uninterrupted one drew without any state to checkpoint, and two choices
never share (or shift) each other's draws. The formulas are here, and only here, because changing any of them
changes every number of the runs that use it.

Per-row sampling seeds (`row_seed`, `row_seeds`): an engine with a sampler of its own (vLLM) draws each row from
its own seed. Deriving the seed from (run seed, purpose, step, process, row) gives identical prompts in one batch
(sdpo's groups, a repeated prompt) different samples. The built-in engines sample on torch's process RNG instead
(`process_seed`), which the run seeds and checkpoints, with the same two guarantees.

A leaf module (the standard library only): the prompt order (`distill.data`), the methods' source draws, the
training state, the samplers and `distill cache-teacher` all import it without reaching up.
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


def process_seed(seed: int, process_index: int) -> int:
    """The seed of process `process_index`'s own RNG streams (Python, NumPy, torch: `transformers.set_seed`), set
    once before the first step; process 0 keeps the run's seed. Its own stream because student sampling draws from
    it, and processes that hold the same prompt (a group spread over processes) must not draw the same completions.
    A prime apart per process; reduced to 32 bits, the range NumPy's seed takes."""
    return (seed + 1_000_003 * process_index) % 2**32


def epoch_order_seed(seed: int, epoch: int) -> int:
    """The seed of the training rows' order in epoch `epoch` (`distill.data.StepSampler`: a fresh permutation per
    epoch). Its own generator, not the process RNG: every process must draw the same order (each takes its share of
    it), whatever it sampled before, and the order of step k must not depend on the steps that ran before it."""
    return seed + 7919 * epoch


def source_draw_seed(seed: int, step: int) -> int:
    """The seed of the draws that pick each micro-batch's completion source at optimizer step `step` (GKD's lmbda
    mixing, `distill.methods.mixing.draw_sources`). Its own generator: every process must draw the same sources for
    the step (they enter the step's collectives together), and the draws must not move the process RNG the student
    samples on."""
    return seed * 1_000_003 + step


def teacher_window_seed(seed: int, first_step: int, process_index: int) -> int:
    """The torch seed the seq_kd teacher samples its window of steps from `first_step` with on process
    `process_index` (its own RNG: the process RNG the student samples on is untouched). One integer per (run seed,
    window, process), so a run resumed inside a window samples the window again alike; the two primes keep windows
    and processes of nearby run seeds apart."""
    return seed * 1_000_003 + first_step + 104_729 * (process_index + 1)


def cache_shard_seed(seed: int, shard: int) -> int:
    """The torch seed the teacher samples shard `shard` of `distill cache-teacher --generate` with (inside a forked
    RNG: the caller's stream is untouched). One per shard, so a shard rebuilt alone (a resumed or partial cache)
    samples what it sampled in the whole build."""
    return seed * 1_000_003 + shard


def guided_turn_draw(seed: int, step: int, row: int, turn: int) -> float:
    """The uniform draw in [0, 1) that decides whether the teacher writes turn `turn` of row `row`'s conversation at
    optimizer step `step` (Guided-OPD, `distill.agents.guidance`): the teacher writes it when the draw is below the
    step's guidance probability. `row`: the row's place among the step's rows over all processes, so the choice does
    not depend on how the rows are split over processes or micro-batches; a function of these four numbers alone,
    so a resumed run draws it again alike and it moves no generator another choice draws from."""
    return row_seed(seed, "guided turn", step, row, turn) / float(1 << SEED_BITS)
