"""Per-token diagnostics the trainer logs next to the loss.

All of them are computed from the same log-probabilities the loss uses (at the loss temperature), one value
per token, so the trainer sums them and reduces them token-weighted (`distill.training.metrics.MetricWindow`) like any other metric.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from distill.no_grad import no_grad

DEFAULT_OVERLAP_K = 8

STAT_NAMES = (
    "student_entropy",  # H(p_s) in nats
    "teacher_entropy",  # H(p_t) in nats
    "forward_kl",  # KL(p_t || p_s)
    "reverse_kl",  # KL(p_s || p_t)
    "top1_agreement",  # 1.0 where argmax p_s == argmax p_t
    "topk_overlap",  # |top-k(p_s) ∩ top-k(p_t)| / k
)


class TokenStats(NamedTuple):
    """Per-token diagnostics, each (N,) float32; zero at masked positions."""

    student_entropy: torch.Tensor
    teacher_entropy: torch.Tensor
    forward_kl: torch.Tensor
    reverse_kl: torch.Tensor
    top1_agreement: torch.Tensor
    topk_overlap: torch.Tensor

    @classmethod
    def from_columns(cls, columns: torch.Tensor) -> "TokenStats":
        """columns: (N, len(STAT_NAMES)) in STAT_NAMES order."""
        return cls(*columns.unbind(dim=1))


@no_grad
def token_statistics(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, overlap_k: int = DEFAULT_OVERLAP_K
) -> torch.Tensor:
    """Diagnostics of one block of tokens.

    Args:
        student_log_probs, teacher_log_probs: (C, V) float32 log-probabilities.
        overlap_k: k of the top-k overlap (clipped to V).

    Returns:
        (C, len(STAT_NAMES)) float32, columns in STAT_NAMES order.
    """
    student_probs = student_log_probs.exp()
    teacher_probs = teacher_log_probs.exp()
    log_ratio = teacher_log_probs - student_log_probs
    k = min(overlap_k, student_log_probs.shape[-1])
    student_top = student_log_probs.topk(k, dim=-1).indices
    teacher_top = teacher_log_probs.topk(k, dim=-1).indices
    overlap = (student_top.unsqueeze(-1) == teacher_top.unsqueeze(-2)).any(dim=-1).sum(dim=-1)
    return torch.stack(
        [
            -(student_probs * student_log_probs).sum(-1),
            -(teacher_probs * teacher_log_probs).sum(-1),
            (teacher_probs * log_ratio).sum(-1),
            -(student_probs * log_ratio).sum(-1),
            (student_top[:, 0] == teacher_top[:, 0]).float(),
            overlap.float() / k,
        ],
        dim=1,
    )


def divergence_diagnostics(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    temperature: float = 1.0,
    overlap_k: int = DEFAULT_OVERLAP_K,
) -> TokenStats:
    """Per-token diagnostics from full logits (N, V); for evaluation and for small vocabularies."""
    student = torch.log_softmax(student_logits.detach().float() / temperature, dim=-1)
    teacher = torch.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    return TokenStats.from_columns(token_statistics(student, teacher, overlap_k))
