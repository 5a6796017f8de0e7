"""Dense generalized JSD on full logits: the reference-compatible API and the math every fast path matches.

Definition (GKD, arXiv 2306.13649, Eq. 1), with p_s = softmax(z_s / T), p_t = softmax(z_t / T) and the
mixture m = (1 - beta) p_s + beta p_t:

    JSD_beta = beta KL(p_t || m) + (1 - beta) KL(p_s || m)

and the two ends taken exactly: beta = 0 is forward KL KL(p_t || p_s), beta = 1 is reverse KL KL(p_s || p_t).

`generalized_jsd_loss` has the signature and the values of the reference library's
`GKDTrainer.generalized_jsd_loss`, so numbers carry over, with two deliberate differences: the math always
runs in float32 whatever the input dtype (bf16/fp16 logits are upcast, the result is float32), and `beta`
is never rounded to the input dtype (the reference builds `torch.tensor(beta, dtype=bf16)`, which turns
0.1 into 0.10009765625).

This path holds several [tokens x vocab] tensors at once; training uses `chunked_generalized_jsd`, which
starts from hidden states and never does.
"""

from __future__ import annotations

import math

import torch

from distill.losses.checks import check_beta, check_same_vocab, check_temperature

REDUCTIONS = ("batchmean", "sum", "mean", "none")


def generalized_jsd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    reduction: str = "batchmean",
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Generalized JSD between student and teacher next-token distributions.

    Args:
        student_logits: (B, T, V) or (N, V), any float dtype.
        teacher_logits: same shape as `student_logits`.
        labels: (B, T) / (N,); positions equal to -100 are excluded.
        beta: in [0, 1]; 0 = forward KL(p_t || p_s), 1 = reverse KL(p_s || p_t).
        temperature: > 0, divides both logits.
        reduction: "batchmean" (sum / valid tokens with labels, sum / B without), "sum", "mean" (mean over
            the kept elements, vocabulary included, as the reference does) or "none" (the elementwise terms,
            (n_valid, V) with labels, the input shape without; sum the last dim for per-token divergences).
        num_items_in_batch: when given, the result is sum / num_items_in_batch (gradient-accumulation-correct
            normalisation), whatever `reduction` says, as in the reference.

    Returns:
        float32 tensor: a scalar, or the elementwise terms for reduction="none".
    """
    beta = check_beta(beta)
    temperature = check_temperature(temperature)
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if student_logits.dim() < 2 or teacher_logits.dim() < 2:
        raise ValueError("student_logits and teacher_logits must have a vocabulary dimension (..., V)")
    check_same_vocab(student_logits.shape[-1], teacher_logits.shape[-1], "generalized_jsd_loss")
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student_logits {tuple(student_logits.shape)} and teacher_logits {tuple(teacher_logits.shape)} "
            "must have the same shape"
        )
    if labels is not None and labels.shape != student_logits.shape[:-1]:
        raise ValueError(
            f"labels must have shape {tuple(student_logits.shape[:-1])} (the logits without the vocabulary "
            f"dimension), got {tuple(labels.shape)}"
        )

    student_log_probs = torch.log_softmax(student_logits.float() / temperature, dim=-1)
    teacher_log_probs = torch.log_softmax(teacher_logits.float() / temperature, dim=-1)
    terms = generalized_jsd_terms(student_log_probs, teacher_log_probs, beta)

    mask = None
    if labels is not None:
        mask = labels != -100
        terms = terms[mask]

    if num_items_in_batch is not None:
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(terms.device)
        return terms.sum() / num_items_in_batch
    if reduction == "batchmean":
        denominator = mask.sum().clamp_min(1) if mask is not None else max(terms.size(0), 1)
        return terms.sum() / denominator
    if reduction == "sum":
        return terms.sum()
    if reduction == "mean":
        return terms.mean()
    return terms


def generalized_jsd_terms(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, beta: float) -> torch.Tensor:
    """Elementwise terms of the generalized JSD; their sum over the last dim is the per-token divergence.

    Args:
        student_log_probs, teacher_log_probs: (..., V) float32 log-probabilities.
        beta: a Python float in [0, 1] (kept in double precision until it meets a float32 tensor).
    """
    if beta == 0.0:
        return teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)
    if beta == 1.0:
        return student_log_probs.exp() * (student_log_probs - teacher_log_probs)
    mixture_log_probs = torch.logaddexp(student_log_probs + math.log1p(-beta), teacher_log_probs + math.log(beta))
    kl_teacher = teacher_log_probs.exp() * (teacher_log_probs - mixture_log_probs)
    kl_student = student_log_probs.exp() * (student_log_probs - mixture_log_probs)
    return beta * kl_teacher + (1.0 - beta) * kl_student
