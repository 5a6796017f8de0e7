"""Hidden states of a model at the positions that predict completion tokens."""

from __future__ import annotations

import torch
from torch import nn


def predicting_positions(completion_mask: torch.Tensor) -> torch.Tensor:
    """(B, T-1) bool: positions whose next-token distribution predicts a completion token."""
    return completion_mask[:, 1:]


def completion_targets(input_ids: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """(N,) long: the completion tokens, in the row-major order of `predicting_positions`."""
    return input_ids[:, 1:][predicting_positions(completion_mask)]


def backbone_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    extras: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Last hidden states (B, T, H) of `model`, without computing any logits, through its kind's forward
    (`distill.models.kinds`: a causal LM's decoder), with the batch's extra inputs."""
    from distill.models.kinds import model_kind_of

    return model_kind_of(model).hidden(model, input_ids, attention_mask, extras or {})
