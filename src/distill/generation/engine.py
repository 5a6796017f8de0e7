"""What a generation engine is, and the table of registered engines.

An engine decodes one left-padded batch: `decode(model, input_ids, attention_mask, sampling, ...)` returns
the new tokens (B, L) on the CPU (rows that finished padded with `pad_id`) and, when asked, each chosen
token's log-prob under the distribution it was drawn from (the processed scores: temperature, top-k,
top-p). `refusal(model, device)` says why it cannot decode a model (None: it can); `auto` takes the first
registered engine, in order of preference, that does not refuse. Engines hold no copy of the weights: they
decode the model they are given (the student as it is now, a teacher, a self-teacher).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Protocol

import torch

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
               with_log_probs: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, L) long new tokens on the CPU and, with `with_log_probs`, (B, L) float32 log-probs, or None."""


_ENGINES: dict[str, Engine] = {}


def register_engine(engine: Engine) -> Engine:
    if engine.name == AUTO or engine.name in _ENGINES:
        raise ValueError(f"a generation engine named {engine.name!r} is already registered")
    _ENGINES[engine.name] = engine
    return engine


def unregister_engine(name: str) -> None:
    """Remove an engine (tests that register a toy engine clean up with this)."""
    _ENGINES.pop(name, None)


def engine_names() -> tuple[str, ...]:
    return tuple(sorted(_ENGINES, key=lambda name: (_ENGINES[name].auto_order, name)))


def get_engine(name: str) -> Engine:
    """The registered engine `name`; an unknown name is a ValueError listing the others."""
    if name not in _ENGINES:
        close = difflib.get_close_matches(str(name), list(_ENGINES) + [AUTO], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"generation_engine must be {AUTO!r} or one of {engine_names()}, got {name!r}{hint}")
    return _ENGINES[name]


def check_engine_name(name: str) -> None:
    if name != AUTO:
        get_engine(name)
