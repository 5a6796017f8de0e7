"""Log-probs of the sampled tokens only: a teacher's, from any signal that has them, and the sampling policy's.

Sampled-token objectives (IW-OPD, policy gradients) need one number per completion token, never a
distribution. A teacher model on this process gives it from its hidden states, chunked (no [tokens x vocab]
tensor); a server gives it as the completion token's entry of `prompt_logprobs`; several teachers fill their
own positions. A position no teacher covers is an error, never a silent zero.
"""

from __future__ import annotations

import torch

from distill.losses.token_log_probs import token_log_probs
from distill.objectives.base import StudentTokens
from distill.signals import DenseSignal, RoutedSignal, SparseSignal


def teacher_token_log_probs(tokens: StudentTokens, signal, temperature: float, chunk_size: int) -> torch.Tensor:
    """(N,) float32: the teacher's log-prob of each completion token, at `temperature`."""
    n = tokens.targets.shape[0]
    if isinstance(signal, RoutedSignal):
        out = torch.full((n,), float("nan"), dtype=torch.float32, device=tokens.targets.device)
        for _, index, part in signal.parts:
            out[index] = teacher_token_log_probs(tokens.select(index), part, temperature, chunk_size)
        values = out
    elif isinstance(signal, DenseSignal):
        values = token_log_probs(signal.hidden, signal.head, tokens.targets, temperature, chunk_size)
    elif isinstance(signal, SparseSignal):
        if abs(signal.temperature - temperature) > 1e-6:
            raise ValueError(f"the teacher's log-probs are at temperature {signal.temperature}, the loss asks for "
                             f"{temperature}: score the teacher at the loss temperature")
        if signal.sampled_log_probs is None:
            raise ValueError("a sampled-token objective needs the teacher's log-prob of every completion token, and this "
                             "sparse teacher gives only its top-k (a server answers it with prompt_logprobs)")
        values = signal.sampled_log_probs.float()
    else:
        raise TypeError(f"a sampled-token objective cannot use a {type(signal).__name__}")
    if values.shape != (n,):
        raise ValueError(f"the teacher scored {tuple(values.shape)} positions, the micro-batch has {n} completion tokens")
    missing = ~torch.isfinite(values)
    if bool(missing.any()):
        raise ValueError(f"the teacher gave no finite log-prob for {int(missing.sum())} of {n} completion tokens; every "
                         "sampled token needs one (a server clamps -inf to -9999, so this is a teacher that skipped positions)")
    return values


def sampling_log_probs(tokens: StudentTokens, temperature: float, chunk_size: int) -> torch.Tensor:
    """(N,) log pi_old of each completion token: recorded at generation, or, when not recorded, recomputed
    from the current student (the same policy for a rollout generated this step), without gradients."""
    if tokens.rollout_log_probs is not None:
        return tokens.rollout_log_probs.float()
    return token_log_probs(tokens.hidden.detach(), tokens.head, tokens.targets, temperature, chunk_size)
