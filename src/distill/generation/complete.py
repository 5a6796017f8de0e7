"""`generate_completions`: the one entry every sampler calls, whatever the engine.

Shared by every engine: prompts cut into batches and left-padded, output-embedding rows past the
tokenizer's vocabulary suppressed, each completion cut at its first EOS (kept; pad == eos is safe), and
whether it stopped at max_new_tokens. The engine (`SamplingParams.engine`) decodes each batch.
"""

from __future__ import annotations

import logging

import torch

from distill.generation.engine import ConversationCache, DecodeRequest, Engine, SamplingParams
from distill.generation.registry import AUTO, engine_names, get_engine
from distill.generation.sample import Sample
from distill.models.inputs import RowExtras, collate_extras
from distill.models.kinds import model_kind_of
from distill.no_grad import no_grad

logger = logging.getLogger("distill.rollout")  # the name users saw for the decode-loop line before engines

_logged: set[str] = set()


def first_eos_mask(tokens: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """(B, L) bool: True up to and including each row's first EOS, False after it (pad == eos is safe)."""
    if not eos_ids:
        return torch.ones_like(tokens, dtype=torch.bool)
    is_eos = torch.isin(tokens, torch.tensor(eos_ids, device=tokens.device))
    eos_seen_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return ~eos_seen_before


def choose_engine(name: str, model, device: torch.device, extras: tuple[str, ...] = ()) -> Engine:
    """The engine `name` (refusing `model` is an error), or under `auto` the first taking part in auto
    choice (`auto_order` not None) that does not refuse it; the choice is logged once per reason. With
    `extras` (the model's inputs beyond the ids) only an engine that `takes_extras` decodes."""

    def refusal(engine: Engine) -> str | None:
        if extras and not engine.takes_extras:
            return f"{engine.label} decodes token ids only and this model takes {list(extras)} too"
        return engine.refusal(model, device)

    if name != AUTO:
        engine = get_engine(name)
        reason = refusal(engine)
        if reason is not None:
            raise ValueError(f"generation_engine {name}: {reason}; set generation_engine: {AUTO} to fall back")
        return engine
    refused: list[str] = []
    for candidate in engine_names():
        engine = get_engine(candidate)
        if engine.auto_order is None:
            continue
        reason = refusal(engine)
        if reason is None:
            message = f"decoding with {engine.label}" + (f": {'; '.join(refused)}" if refused else "")
            if message not in _logged:
                _logged.add(message)
                logger.info(message)
            return engine
        refused.append(reason)
    raise ValueError(f"no generation engine can decode this model ({'; '.join(refused)})")


@no_grad
def generate_completions(
    model,
    prompts: list[list[int]],
    sampling: SamplingParams,
    eos_ids: list[int],
    pad_id: int,
    device: torch.device,
    batch_size: int | None = None,
    stopping_criteria=None,
    vocab_size: int | None = None,
    with_log_probs: bool = False,
    seeds: list[int] | None = None,
    stop_ids: list[int] | None = None,
    extras: list[RowExtras] | None = None,
    seeded_rows: bool = False,
    conversations: ConversationCache | None = None,
    conversation_keys: list[int] | None = None,
) -> list[Sample]:
    """Sample a completion for each prompt with the engine `sampling.engine` names (module docstring).

    Returns one `Sample` per prompt: its ids ending at the first EOS, whether it stopped at max_new_tokens
    (`hit_max`), and with `with_log_probs` each token's log-prob under the sampling distribution (else None).
    `stopping_criteria` (a transformers StoppingCriteriaList) may end rows early; the caller then cuts them.
    `vocab_size`: the tokenizer's size; rows of an output embedding padded past it (e.g. to a multiple of 64)
    are never sampled, since those ids mean nothing to the tokenizer or the loss.
    `seeds`: one per prompt (`distill.seeds`); every sampler in a run passes them. None is for
    the built-in engines only (they sample on torch's RNG); an engine that seeds rows itself refuses it.
    `stop_ids`: where a row stops (kept), when that is not only at an EOS (the end of a turn); None: `eos_ids`.
    A completion is cut at its first stop and "ended" when that token is an EOS.
    `extras`: one `RowExtras` per prompt (the model kind's inputs beyond the ids), or None.
    `seeded_rows`: every engine draws each row from its own seed, never from torch's process RNG (needs `seeds`).
    `conversations`, `conversation_keys`: the prompts are turns of conversations (one key per prompt, the same key for
    a conversation's every turn) and the engine may keep them between turns there (`ConversationCache`).
    """
    if seeded_rows and seeds is None:
        raise ValueError("generate_completions: seeded_rows needs one seed per prompt; none were given")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"generate_completions: {len(seeds)} seeds for {len(prompts)} prompts; give one per prompt")
    if conversation_keys is not None and len(conversation_keys) != len(prompts):
        raise ValueError(f"generate_completions: {len(conversation_keys)} conversation keys for {len(prompts)} prompts")
    if extras is not None and len(extras) != len(prompts):
        raise ValueError(f"generate_completions: {len(extras)} rows of extras for {len(prompts)} prompts; give one per prompt")
    stops = list(eos_ids) if stop_ids is None else list(stop_ids)
    results: list[Sample] = []
    batch_size = batch_size or max(len(prompts), 1)
    engine = choose_engine(sampling.engine, model, device, tuple(sorted(extras[0])) if extras else ())
    kind = model_kind_of(model)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            width = max(len(p) for p in chunk)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
            padded_rows = _output_rows(model) - vocab_size if vocab_size is not None else 0
            suppress = list(range(vocab_size, vocab_size + padded_rows)) if vocab_size is not None and padded_rows > 0 else []
            suppress += kind.never_generated(model)
            batch_extras = collate_extras(extras[start : start + batch_size]) if extras is not None else {}
            request = DecodeRequest(input_ids, attention_mask, sampling, stops, list(eos_ids), pad_id, device, suppress,
                                    stopping_criteria, with_log_probs, None if seeds is None else seeds[start : start + batch_size],
                                    kind.forward_inputs(model, input_ids, batch_extras), seeded_rows,
                                    conversations if conversation_keys is not None else None,
                                    None if conversation_keys is None else conversation_keys[start : start + batch_size])
            generated, log_probs = engine.decode(model, request)
            keep = first_eos_mask(generated, stops)
            for row in range(len(chunk)):
                ids = generated[row][keep[row]].tolist()
                ended = bool(ids) and ids[-1] in eos_ids
                row_log_probs = None
                if with_log_probs:
                    assert log_probs is not None  # an engine asked for log-probs returns them
                    row_log_probs = log_probs[row][: len(ids)].tolist()
                results.append(Sample(ids, not ended and len(ids) >= sampling.max_new_tokens, row_log_probs))
    finally:
        model.train(was_training)
    return results


def _output_rows(model) -> int:
    head = model.get_output_embeddings()
    return head.weight.shape[0] if head is not None else 0
