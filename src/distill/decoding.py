"""A lean sampling loop on a causal LM's forward: what HF `generate` does for distill's requests, minus its
per-step machinery (logits-processor lists, stopping-criteria objects, input preparation, mask rebuilding).

Same result as `generate` by construction: the same prefill (left padding, positions from the attention
mask's cumulative sum, logits of the last position only), the same processing of the last position's
float32 logits (padded vocabulary rows suppressed, then temperature, top-k, top-p, as transformers orders
them), `torch.multinomial` on the softmax (so the same draws from the same RNG state) or argmax, padding after
a row's EOS, and a stop when every row has ended. Tests compare tokens with `generate` (greedy and seeded
sampling) and the first step's empirical distribution with the exact softmax.
"""

from __future__ import annotations

import torch
from torch import nn


def supports_lean_loop(model: nn.Module) -> bool:
    """A transformers decoder-only model (a PEFT wrapper or a custom module goes through `generate`)."""
    from transformers import PreTrainedModel

    return isinstance(model, PreTrainedModel) and not getattr(model.config, "is_encoder_decoder", False)


def process_scores(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, do_sample: bool,
                   suppress_from: int | None) -> torch.Tensor:
    """(B, V) float32 logits -> the scores sampled from: suppressed rows and filtered tokens at -inf."""
    scores = logits
    if suppress_from is not None and suppress_from < scores.shape[-1]:
        scores = scores.clone()
        scores[:, suppress_from:] = -float("inf")
    if not do_sample:
        return scores
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(scores, descending=False, dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        removed = cumulative <= 1 - top_p
        removed[:, -1] = False  # the most likely token always stays
        scores = scores.masked_fill(removed.scatter(1, order, removed), -float("inf"))
    return scores


@torch.no_grad()
def sample(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
           temperature: float, top_k: int, top_p: float, do_sample: bool, eos_ids: list[int], pad_id: int,
           suppress_from: int | None = None, with_log_probs: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Generate up to `max_new_tokens` after left-padded prompts `input_ids` (B, P).

    Returns the new tokens (B, L), L <= max_new_tokens (pad after a row's EOS), and with `with_log_probs` the
    log-prob of each sampled token under the processed scores (B, L) float32."""
    from transformers import DynamicCache

    batch, device = input_ids.shape[0], input_ids.device
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    cache = DynamicCache(config=model.config)
    output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1)
    eos = torch.tensor(eos_ids or [-1], device=device)
    running = torch.ones(batch, dtype=torch.bool, device=device)
    position = positions[:, -1:] + 1
    mask = attention_mask
    tokens, log_probs = [], []
    for step in range(max_new_tokens):
        scores = process_scores(output.logits[:, -1].float(), temperature, top_k, top_p, do_sample, suppress_from)
        chosen = torch.multinomial(scores.softmax(dim=-1), 1).squeeze(1) if do_sample else scores.argmax(dim=-1)
        if with_log_probs:
            log_probs.append(scores.log_softmax(dim=-1).gather(1, chosen[:, None]).squeeze(1))
        chosen = torch.where(running, chosen, torch.full_like(chosen, pad_id))
        tokens.append(chosen)
        running &= ~torch.isin(chosen, eos)
        if step == max_new_tokens - 1 or not bool(running.any()):
            break
        mask = torch.cat([mask, mask.new_ones(batch, 1)], dim=1)
        output = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=position, past_key_values=cache,
                       use_cache=True)
        position = position + 1
    generated = torch.stack(tokens, dim=1) if tokens else input_ids.new_zeros(batch, 0)
    if not with_log_probs:
        return generated, None
    return generated, torch.stack(log_probs, dim=1) if log_probs else torch.zeros(batch, 0)
