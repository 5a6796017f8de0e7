"""The lean loop's keys and values of a rollout's conversations, kept from one turn to the next.

Why: in the tool-call loop each turn is sampled after the whole conversation so far (the prompt, the earlier turns,
the tool results). Re-encoding it every turn costs a forward over a context that grows with every turn, most of it
already encoded; a turn's new ids are few (the end of the last turn, the tool turns, the next header). `TurnCache`
keeps one `LlamaDecoder` for the rollout's conversations and feeds each turn only the ids after what it holds.

How: every decoder row is a conversation, named by the caller's key (its row in the tool loop); a row's real slots
hold `held[row]`, the ids already encoded, in order. A turn's decode (`lean_generate` with this cache) gets each
conversation's whole context, as every engine does; where the context starts with what the row holds, only the rest
is appended; otherwise (a new conversation, or a template that re-rendered its history: a new piece) the row starts
over in fresh slots. Rows not in a turn's batch (ended, or written by the teacher this turn) are dropped; a row that
comes back starts over. After the turn, the slots of the steps a row ran past its end are masked, and the ids fed
for it join `held`; the last sampled token was never fed, so it is the first id of the next turn's suffix.

What differs from re-encoding: a product over the appended ids rounds differently from one over the whole context
(about 1e-6 relative on a logit), so greedy tokens are the same except at a near tie, and sampling draws from the same
distribution with the same use of the random stream (one uniform per row and step).

One cache serves one rollout of one model: it starts over when given another model or when the weights changed in
place (an optimizer step; tensor version counters), so a stale cache is never read.
"""

from __future__ import annotations

import torch
from torch import nn

from distill.generation.lean_decode import LlamaDecoder


def _weights_version(model: nn.Module) -> int:
    """A number that changes whenever a parameter is written in place (an optimizer step)."""
    return sum(parameter._version for parameter in model.parameters())


class TurnCache:
    """Each conversation's encoded ids between turns (module docstring); `resume` before a turn, `turn_ended` after."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.version = _weights_version(model)
        self.decoder: LlamaDecoder | None = None
        self.keys: list[int] = []
        self.held: list[list[int]] = []  # per decoder row, the ids its real slots hold, in order

    def serves(self, model: nn.Module) -> bool:
        """Whether what it holds was encoded by `model` as its weights are now."""
        return model is self.model and _weights_version(model) == self.version

    def resume(self, model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, keys: list[int],
               max_new_tokens: int) -> tuple[LlamaDecoder, torch.Tensor]:
        """The decoder with each row's context fed (only what it did not hold) and the last position's logits (B, V).

        input_ids, attention_mask: (B, T) left-padded, each row a conversation's whole context; keys: (B) its key.
        The decoder's rows are `keys` in order after this, with room for `max_new_tokens` more steps."""
        assert model is self.model, "TurnCache.resume with another model; make a new cache"
        contexts = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)]
        where = {key: row for row, key in enumerate(self.keys)}
        order = [where.get(key) for key in keys]
        if self.decoder is None:
            decoder = LlamaDecoder(model, len(keys), 0)
        else:
            decoder = self.decoder
            decoder.select(order)
        held = [list(self.held[row]) if row is not None else [] for row in order]
        for row, (context, ids) in enumerate(zip(contexts, held)):
            if ids and (len(context) <= len(ids) or context[: len(ids)] != ids):
                decoder.forget(row)
                held[row] = []
        suffixes = [context[len(ids):] for context, ids in zip(contexts, held)]
        width = max(map(len, suffixes))
        suffix_ids = torch.zeros((len(keys), width), dtype=torch.long)
        suffix_mask = torch.zeros((len(keys), width), dtype=torch.long)
        for row, suffix in enumerate(suffixes):
            suffix_ids[row, width - len(suffix):] = torch.tensor(suffix, dtype=torch.long)
            suffix_mask[row, width - len(suffix):] = 1
        needed = decoder.length + width + max_new_tokens
        if needed > decoder.capacity:  # grown by half at least, so a rollout copies its cache a few times, not every turn
            decoder.reserve(max(needed, decoder.capacity * 3 // 2))
        logits = decoder.append(suffix_ids, suffix_mask)
        self.decoder, self.keys = decoder, list(keys)
        self.held = [ids + suffix for ids, suffix in zip(held, suffixes)]
        return decoder, logits

    def turn_ended(self, first_slot: int, generated: torch.Tensor, fed: list[torch.Tensor]) -> None:
        """generated: (B, L) the turn's tokens; fed: per step fed to the cache (slot `first_slot` + step), (B) bool: the
        row's own token (True) or padding after its end (False, masked from now on)."""
        assert self.decoder is not None, "TurnCache.turn_ended before resume"
        if not fed:
            return
        live = torch.stack(fed, dim=1)  # (B, S): S = the steps fed
        steps = live.shape[1]
        bias = self.decoder.key_bias[:, 0, 0, first_slot : first_slot + steps]
        bias.masked_fill_(~live, float("-inf"))
        for row in range(live.shape[0]):
            self.held[row].extend(generated[row, :steps][live[row]].tolist())
        # rotary positions count a row's own ids: a row that ended early went on stepping past them
        self.decoder.next_position = torch.tensor([[len(ids)] for ids in self.held], dtype=torch.long)
