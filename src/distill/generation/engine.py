"""What a generation engine is (its table is `distill.generation.registry`).

An engine decodes one left-padded batch: `decode(model, DecodeRequest)` returns
the new tokens (B, L) on the CPU (rows that finished padded with `pad_id`) and, when asked, each chosen
token's log-prob under the distribution it was drawn from (the processed scores: temperature, top-k,
top-p). `refusal(model, device)` says why it cannot decode a model (None: it can); `auto` takes the first
registered engine, in order of preference, that does not refuse. Every member callers use is declared by
`Engine`, with a default that fits an engine holding nothing of its own; `register_engine` refuses anything
else. The built-in engines hold no copy of the weights: they decode the model they are given (the student as
it is now, a teacher, a self-teacher). An engine that keeps its own copy (vLLM, in the process or behind a
server) sets `keeps_weights` and defines `sync_weights(model)`, and a run that names it calls it with the
student before the first rollout and after every optimizer step (`distill.generation.sync.WeightSync`); an
engine may instead notice itself that a model's weights changed (the vLLM engine compares a fingerprint of
the weights before each decode, `distill.generation.vllm_engine`).

Seeds. Every caller passes one seed per row (`distill.seeds`: from the run's seed, the step, the
process and the row). An engine with a sampler of its own (vLLM) must seed each row with it; the built-ins
sample on torch's process RNG, which the run seeds and checkpoints, and so keep the numbers of every run
made before seeds existed, unless a request asks for `seeded_rows` (the asynchronous producer samples in a thread
beside training, so its samples must not touch the process RNG): then they too draw each row from its own seed.
Either way identical prompts get different samples and a resumed run draws the samples an uninterrupted one drew.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from distill.config.values import AUTO_ENGINE as AUTO

if TYPE_CHECKING:
    from distill.config import DistillConfig


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    do_sample: bool = True
    engine: str = AUTO  # a registered engine's name (`generation_engine`), or auto: the first that applies


class ConversationCache:
    """What an engine may keep of a rollout's conversations from one turn to the next (the lean loop: each
    conversation's keys and values, `distill.generation.lean_turns`), so that a turn's decode encodes only the ids
    after what it kept. The tool-call loop's sampler makes one per rollout and hands it to every turn's decode with
    each row's conversation key (`DecodeRequest.conversations`); an engine that keeps nothing ignores it. Dropped when
    the rollout ends: the weights change after."""

    def __init__(self) -> None:
        self.state: object | None = None  # the engine's own, replaced by an engine that cannot read it


@dataclass(frozen=True)
class DecodeRequest:
    """One left-padded batch for an engine to decode.

    input_ids, attention_mask: (B, T) long, left-padded; sampling: temperature, top-k/p, max_new_tokens.
    stop_ids: a row stops at its first token among these (kept): the end of a turn. end_ids: the tokens
        that end a whole completion (EOS); usually the same set, but a turn may end without ending the
        completion (a tool call, answered before the model continues). Engines stop at `stop_ids`.
    pad_id: what finished rows are padded with; suppress_ids: ids never sampled (output rows past the
        tokenizer's vocabulary); stopping_criteria: transformers criteria that may end rows early (engines
        that cannot run them refuse the request); with_log_probs: also return each sampled token's log-prob
        under the processed distribution; device: where the model runs; seeds: one per row, or None from a
        caller outside a run; extras: the model kind's named input tensors for the batch (`distill.batch`),
        given to the model's forward with the ids. seeded_rows: sample each row from a generator seeded by its
        seed even in an engine that otherwise samples on torch's process RNG (the built-ins): what the asynchronous
        producer asks for, since a thread sampling beside training must not share (or depend on) the process RNG.
    conversations, conversation_keys: the rows are turns of conversations (B keys), and `conversations` is where the
        engine may keep them between turns (`ConversationCache`); None: independent prompts.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    sampling: SamplingParams
    stop_ids: list[int]
    end_ids: list[int]
    pad_id: int
    device: torch.device
    suppress_ids: list[int] = field(default_factory=list)
    stopping_criteria: object = None
    with_log_probs: bool = False
    seeds: list[int] | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    seeded_rows: bool = False
    conversations: ConversationCache | None = None
    conversation_keys: list[int] | None = None

    def row_generators(self) -> list[torch.Generator] | None:
        """With `seeded_rows`, one CPU generator per row seeded by its seed; None otherwise (the process RNG)."""
        if not self.seeded_rows:
            return None
        if self.seeds is None:
            raise ValueError("seeded_rows needs one seed per row; none were given")
        return [torch.Generator().manual_seed(seed) for seed in self.seeds]


class Engine(ABC):
    """A generation engine (module docstring). Subclasses set `name`, `label` and `auto_order` and implement
    `refusal` and `decode`; the other members have defaults for an engine that holds nothing of its own.

    name: `generation_engine`'s value for it; label: how messages name it;
    auto_order: preference under `auto`, lowest first; None: only when named.
    reads: the config fields it reads when a run names it (`distill.config_rules.reads`: changed while another engine
        runs, they are an error).
    fields: its own settings (`distill.config.io.PartFields` dataclasses, one or a tuple): registering composes
        them into `DistillConfig` (flat); they are read when a run names it.
    keeps_weights: it decodes its own copy of the student's weights, kept current by `sync_weights`.
    elsewhere: it decodes outside the training process (a server, on hardware of its own), so sampling ahead
        (`max_staleness`) does not share the training process's cores.
    takes_extras: it gives a model kind's extra inputs (`DecodeRequest.extras`) to the model; an engine that
        decodes token ids only is not chosen for a batch that carries extras.
    """

    name: str = ""
    label: str = ""
    auto_order: int | None = None
    reads: tuple[str, ...] = ()
    fields: type | tuple[type, ...] = ()
    keeps_weights: bool = False
    elsewhere: bool = False
    takes_extras: bool = False

    @abstractmethod
    def refusal(self, model, device: torch.device) -> str | None:
        """Why this engine cannot decode `model` on `device`, or None."""

    @abstractmethod
    def decode(self, model, request: DecodeRequest) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L) long new tokens on the CPU and, with `request.with_log_probs`, (B, L) float32 log-probs, or
        None. `request.seeds`: B per-row seeds (module docstring), or None from a caller outside a run."""

    def availability(self) -> str | None:
        """Why it cannot run on this machine (an optional extra not installed), checked with the config; None: it can."""
        return None

    def check_config(self, config: DistillConfig) -> None:
        """Its own settings' rules (a ValueError naming the field), checked with the config's."""

    def configure(self, config: DistillConfig) -> None:
        """Read its settings, once per run, before any decode."""

    def resident_bytes(self, model, config: DistillConfig) -> float:
        """Memory it holds in the training process for sampling `model` under `config`, beyond the model itself
        (`distill doctor`'s estimate): none for an engine that decodes the model it is given."""
        return 0.0

    def sync_weights(self, model) -> None:
        """Make its copy of the weights `model`'s (an engine with `keeps_weights`)."""
        raise TypeError(f"the {self.name} engine decodes the model it is given; it keeps no weights to sync")

    def prepare(self, model) -> None:
        """Get ready to decode `model` (a teacher it will sample from), at the start of a run."""

    def close(self) -> None:
        """Release what it holds for the run (replicas, connections), when the run ends."""


def check_engine(engine: object) -> Engine:
    """An engine registered is an `Engine` with a name (TypeError otherwise, naming what is missing); the engine
    table's check (`distill.generation.registry`)."""
    if not isinstance(engine, Engine):
        raise TypeError(f"register_engine: {type(engine).__name__} is not a distill.generation.engine.Engine; subclass "
                        "Engine (it declares every member callers use, with defaults)")
    if not engine.name:
        raise TypeError(f"register_engine: {type(engine).__name__} has no name (the generation_engine value naming it)")
    if engine.keeps_weights and type(engine).sync_weights is Engine.sync_weights:
        raise TypeError(f"register_engine: {type(engine).__name__} keeps weights but defines no sync_weights")
    return engine

