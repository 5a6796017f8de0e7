"""What a generation engine is, and the table of registered engines.

An engine decodes one left-padded batch: `decode(model, input_ids, attention_mask, sampling, ...)` returns
the new tokens (B, L) on the CPU (rows that finished padded with `pad_id`) and, when asked, each chosen
token's log-prob under the distribution it was drawn from (the processed scores: temperature, top-k,
top-p). `refusal(model, device)` says why it cannot decode a model (None: it can); `auto` takes the first
registered engine, in order of preference, that does not refuse. The built-in engines hold no copy of the
weights: they decode the model they are given (the student as it is now, a teacher, a self-teacher). An engine
that keeps its own copy (vLLM, in the process or behind a server) defines `sync_weights(model)`, and a run
that names it calls it with the student before the first rollout and after every optimizer step
(`distill.generation.sync.WeightSync`); an engine may instead notice itself that a model's weights changed
(the vLLM engine compares a fingerprint of the weights before each decode, `distill.generation.vllm_engine`).

Seeds. Every caller passes one seed per row (`distill.generation.seeds`: from the run's seed, the step, the
process and the row). An engine with a sampler of its own (vLLM) must seed each row with it; the built-ins
sample on torch's process RNG, which the run seeds and checkpoints, and so keep the numbers of every run
made before seeds existed. Either way identical prompts get different samples and a resumed run draws the
samples an uninterrupted one drew.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from distill.registry import Registry

AUTO = "auto"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    do_sample: bool = True
    engine: str = AUTO  # a registered engine's name (`generation_engine`), or auto: the first that applies


class Engine(Protocol):
    name: str
    auto_order: int  # preference under `auto`, lowest first

    def refusal(self, model, device: torch.device) -> str | None:
        """Why this engine cannot decode `model` on `device`, or None."""

    def decode(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, sampling: SamplingParams,
               eos_ids: list[int], pad_id: int, suppress_tokens: list[int], stopping_criteria,
               with_log_probs: bool, device: torch.device, seeds: list[int] | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L) long new tokens on the CPU and, with `with_log_probs`, (B, L) float32 log-probs, or None.
        `seeds`: B per-row seeds (module docstring), or None from a caller outside a run."""

    # Optional: `sync_weights(model) -> None`, for an engine that keeps its own copy of the student's weights;
    # `availability() -> str | None`, why it cannot run here (an extra not installed), checked with the config;
    # `check_config(config) -> None`, its own settings' rules (ValueError naming the field), with the config's;
    # `configure(config) -> None`, for an engine with settings of its own (read once per run, before any decode);
    # `close() -> None`, for an engine holding resources (called when the run ends).


_ENGINES: Registry[Engine] = Registry("generation_engine", "generation engine", also=(AUTO,),
                                     order=lambda name, engine: (engine.auto_order is None, engine.auto_order or 0, name))


# register_engine(engine), unregister_engine(name), engine_names() (those taking part in `auto` first, in order of
# preference), get_engine(name) (an unknown name is a ValueError listing the others).
register_engine, unregister_engine, engine_names, get_engine = _ENGINES.register, _ENGINES.unregister, _ENGINES.names, _ENGINES.get


def check_engine_name(name: str) -> None:
    if name != AUTO:
        get_engine(name)


def configure_engine(config) -> None:
    """Give the engine a run names its settings (`configure(config)`, optional), before anything is decoded."""
    if config.generation_engine != AUTO:
        engine = get_engine(config.generation_engine)
        if callable(getattr(engine, "configure", None)):
            engine.configure(config)


def close_engine(name: str) -> None:
    """Release what the engine `name` holds for the run (`close()`, optional: vLLM's replicas)."""
    if name != AUTO:
        engine = get_engine(name)
        if callable(getattr(engine, "close", None)):
            engine.close()
