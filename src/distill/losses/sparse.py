"""Generalized JSD against a teacher that only gives its top-k log-probs (an inference server, a disk cache).

Both distributions are coarsened onto one partition of the vocabulary, per position:

    cells = the teacher's k top tokens
          + the token actually sampled there, when it is not among them (its teacher log-prob is given)
          + a tail bucket holding all the remaining mass

The student's cell probabilities are exact: the support tokens' log-probs come from the full-vocabulary
logsumexp, and the tail's log-mass is logsumexp over the non-support tokens minus that logsumexp (no
`1 - sum` cancellation). The teacher's tail is `1 - sum` of what it reported (or given explicitly, as a
cache may store it), floored at `min_tail_mass` because reported log-probs are rounded and their sum can
reach 1. The loss is the generalized JSD of the two coarsened distributions, for any beta.

With `tail=False` there is no bucket: both distributions are renormalised on the support instead.

Bias of small k. Coarsening is a deterministic map of outcomes, so by the data-processing inequality the
tail form never exceeds the full-vocabulary divergence: it is a lower bound that tightens as k grows and
equals it when the support covers the vocabulary. What it cannot see is how mass is spread inside the tail,
so with a small k the student is only taught the teacher's ranking of its top tokens plus how much mass
to leave outside them; a flat or spiky tail costs the same. The renormalised form (`tail=False`) drops even
that and can over-sharpen the student: it is not a bound. Keeping the sampled token in the support makes
on-policy samples that the teacher finds unlikely pay their real price instead of vanishing into the tail.
"""

from __future__ import annotations

import math

import torch

from distill.losses.checks import (
    check_beta,
    check_chunk_size,
    check_mask,
    check_matrix,
    check_temperature,
)
from distill.losses.chunked import (
    DEFAULT_CHUNK_SIZE,
    ChunkObjective,
    DistillLoss,
    LogitHead,
    run_chunked,
)
from distill.losses.diagnostics import DEFAULT_OVERLAP_K

DEFAULT_MIN_TAIL_MASS = 1e-6


def coarse_generalized_jsd(
    student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, valid: torch.Tensor, beta: float
) -> torch.Tensor:
    """Generalized JSD between two distributions given on the same cells.

    Args:
        student_log_probs: (C, S) log-probabilities of the student's cells; finite where valid.
        teacher_log_probs: (C, S); -inf (zero mass) allowed where valid.
        valid: (C, S) bool; invalid cells (duplicates, an absent tail) are ignored entirely.
        beta: in [0, 1], the ends exactly forward KL (0) and reverse KL (1).

    Returns:
        (C,) per-token divergence. Differentiable w.r.t. `student_log_probs`.
    """
    student_lp = torch.where(valid, student_log_probs, 0.0)
    teacher_finite = valid & torch.isfinite(teacher_log_probs)
    teacher_lp = torch.where(teacher_finite, teacher_log_probs, 0.0)
    student_p = torch.where(valid, student_lp.exp(), 0.0)
    teacher_p = torch.where(teacher_finite, teacher_lp.exp(), 0.0)
    if beta == 0.0:
        terms = teacher_p * (teacher_lp - student_lp)
    elif beta == 1.0:
        # A zero-mass teacher cell costs +inf where the student puts mass there, nothing where it does not
        # (0 * inf would be NaN, in the value and in the gradient).
        teacher_for_reverse = torch.where(valid & (torch.isfinite(teacher_log_probs) | (student_p > 0)), teacher_log_probs, 0.0)
        terms = student_p * (student_lp - teacher_for_reverse)
    else:
        teacher_mix = torch.where(teacher_finite, teacher_lp + math.log(beta), -math.inf)
        log_mixture = torch.logaddexp(student_lp + math.log1p(-beta), teacher_mix)
        terms = beta * teacher_p * (teacher_lp - log_mixture) + (1.0 - beta) * student_p * (student_lp - log_mixture)
    return torch.where(valid, terms, 0.0).sum(-1)


def teacher_cells(
    topk_ids: torch.Tensor,
    topk_log_probs: torch.Tensor,
    sampled_ids: torch.Tensor | None,
    sampled_log_probs: torch.Tensor | None,
    tail_log_probs: torch.Tensor | None,
    tail: bool,
    min_tail_mass: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The partition and the teacher's coarsened distribution on it.

    Returns:
        support_ids: (N, S) long, S = k (+1 with sampled tokens); invalid slots repeat the row's first id.
        teacher_lp: (N, S + 1) float32 log-probs of the cells, the last one the tail.
        valid: (N, S + 1) bool. The tail cell's validity is refined per block (it needs the student side to
            know whether any token lies outside the support).
    """
    ids = topk_ids.long()
    log_probs = topk_log_probs.float()
    valid = torch.ones_like(ids, dtype=torch.bool)
    if sampled_ids is not None:
        assert sampled_log_probs is not None  # given together
        sampled = sampled_ids.long().unsqueeze(1)
        sampled_is_new = ~(ids == sampled).any(dim=1, keepdim=True)
        ids = torch.cat([ids, torch.where(sampled_is_new, sampled, ids[:, :1])], dim=1)
        log_probs = torch.cat([log_probs, sampled_log_probs.float().unsqueeze(1)], dim=1)
        valid = torch.cat([valid, sampled_is_new], dim=1)
    log_probs = torch.where(valid, log_probs, -math.inf)
    if tail:
        if tail_log_probs is not None:
            tail_lp = tail_log_probs.float()
        else:
            support_mass = torch.where(valid, log_probs.double().exp(), 0.0).sum(dim=1)
            tail_lp = (1.0 - support_mass).clamp_min(min_tail_mass).log().float()
        tail_lp = tail_lp.clamp_min(math.log(min_tail_mass))
        tail_valid = torch.ones_like(tail_lp, dtype=torch.bool)
    else:
        log_probs = log_probs - torch.logsumexp(log_probs, dim=1, keepdim=True)
        tail_lp = torch.full_like(log_probs[:, 0], -math.inf)
        tail_valid = torch.zeros_like(tail_lp, dtype=torch.bool)
    teacher_lp = torch.cat([log_probs, tail_lp.unsqueeze(1)], dim=1)
    return ids, teacher_lp, torch.cat([valid, tail_valid.unsqueeze(1)], dim=1)


def sparse_block(
    student_logits: torch.Tensor,
    support_ids: torch.Tensor,
    teacher_lp: torch.Tensor,
    valid: torch.Tensor,
    beta: float,
    tail: bool,
    need_grad: bool,
    overlap_k: int | None,
    topk_count: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Coarsened JSD of one block and its gradient w.r.t. the student logits (overwritten).

    The loss depends on the student only through three small quantities: the support logits a (C, S),
    the full logsumexp L and the non-support logsumexp L_ns. Autograd differentiates the small loss w.r.t.
    them; the chain rule back to the logits u is then exact and cheap:
        dL/du_j = dL/dL_ns * softmax_ns(u)_j  (j outside the support)
                + dL/dL    * softmax(u)_j
                + sum over the cells holding j of dL/da
    """
    logits = student_logits
    support_logits = logits.gather(1, support_ids)
    full_lse = torch.logsumexp(logits, dim=1)
    stats = _sparse_stats_inputs(logits, full_lse, overlap_k) if overlap_k is not None else None
    if tail:
        logits.scatter_(1, support_ids, -math.inf)
        tail_lse = torch.logsumexp(logits, dim=1)
        has_tail = torch.isfinite(tail_lse)
    else:
        tail_lse = torch.zeros_like(full_lse)
        has_tail = torch.zeros_like(full_lse, dtype=torch.bool)
    cells_valid = valid.clone()
    cells_valid[:, -1] &= has_tail

    with torch.enable_grad():
        a = support_logits.detach().requires_grad_(need_grad)
        lse = full_lse.detach().requires_grad_(need_grad)
        lse_ns = torch.where(has_tail, tail_lse, 0.0).requires_grad_(need_grad)
        student_lp = _student_cells(a, lse, lse_ns, valid[:, :-1], tail)
        loss = coarse_generalized_jsd(student_lp, teacher_lp, cells_valid, beta)
        grads = torch.autograd.grad(loss.sum(), (a, lse, lse_ns), allow_unused=True) if need_grad else None

    if stats is not None:
        stats = _sparse_stats(stats, student_lp.detach(), teacher_lp, cells_valid, support_ids, topk_count, overlap_k)
    if not need_grad:
        return loss.detach(), None, stats

    assert grads is not None  # need_grad
    d_support, d_lse, d_tail = (torch.zeros_like(x) if g is None else g for g, x in zip(grads, (a, lse, lse_ns)))
    if tail:
        # Outside the support: dL/dL_ns * exp(u - L_ns) + dL/dL * exp(u - L) = exp(u - L_ns) * coef.
        safe_tail = torch.where(has_tail, tail_lse, 0.0)
        coef = torch.where(has_tail, d_tail + d_lse * (safe_tail - full_lse).exp(), 0.0)
        grad = logits.sub_(safe_tail.unsqueeze(1)).exp_().mul_(coef.unsqueeze(1))
    else:
        grad = logits.zero_()
    # On the support (duplicate slots write the same value), then the cells' own gradients.
    grad.scatter_(1, support_ids, (support_logits - full_lse.unsqueeze(1)).exp() * d_lse.unsqueeze(1))
    grad.scatter_add_(1, support_ids, torch.where(valid[:, :-1], d_support, 0.0))
    return loss.detach(), grad, stats


def _student_cells(a, lse, lse_ns, support_valid, tail):
    """Student log-probs of the cells (C, S + 1) from the support logits, full and non-support logsumexp."""
    if tail:
        return torch.cat([a - lse.unsqueeze(1), (lse_ns - lse).unsqueeze(1)], dim=1)
    on_support = torch.where(support_valid, a, -math.inf)
    renormalised = a - torch.logsumexp(on_support, dim=1, keepdim=True)
    return torch.cat([renormalised, torch.zeros_like(lse).unsqueeze(1)], dim=1)


def _sparse_stats_inputs(logits, full_lse, overlap_k):
    """What the diagnostics need from the full student row before the block is overwritten."""
    probs = (logits - full_lse.unsqueeze(1)).exp_()
    entropy = full_lse - torch.bmm(probs.unsqueeze(1), logits.unsqueeze(2)).view(-1)
    top = logits.topk(overlap_k, dim=1).indices
    return entropy, top


def _sparse_stats(inputs, student_lp, teacher_lp, cells_valid, support_ids, topk_count, overlap_k):
    """Diagnostics columns in STAT_NAMES order (C, 6)."""
    student_entropy, student_top = inputs
    teacher_p = torch.where(cells_valid & torch.isfinite(teacher_lp), teacher_lp.exp(), 0.0)
    teacher_lp0 = torch.where(teacher_p > 0, teacher_lp, 0.0)
    teacher_entropy = -(teacher_p * teacher_lp0).sum(1)
    forward_kl = coarse_generalized_jsd(student_lp, teacher_lp, cells_valid, 0.0)
    reverse_kl = coarse_generalized_jsd(student_lp, teacher_lp, cells_valid, 1.0)
    k = min(overlap_k, topk_count)
    ranked = teacher_lp[:, :topk_count].argsort(dim=1, descending=True)
    teacher_top = support_ids.gather(1, ranked[:, :k])
    student_top = student_top[:, :k]
    top1 = (student_top[:, 0] == teacher_top[:, 0]).float()
    overlap = (student_top.unsqueeze(-1) == teacher_top.unsqueeze(-2)).any(-1).sum(-1).float() / max(k, 1)
    return torch.stack([student_entropy, teacher_entropy, forward_kl, reverse_kl, top1, overlap], dim=1)


def sparse_generalized_jsd(
    student_hidden: torch.Tensor,
    student_lm_head: torch.Tensor,
    teacher_topk_ids: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    sampled_ids: torch.Tensor | None = None,
    teacher_sampled_log_probs: torch.Tensor | None = None,
    teacher_tail_log_probs: torch.Tensor | None = None,
    beta: float = 0.5,
    temperature: float = 1.0,
    tail: bool = True,
    min_tail_mass: float = DEFAULT_MIN_TAIL_MASS,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    student_bias: torch.Tensor | None = None,
    student_logit_scale: float = 1.0,
    student_softcap: float | None = None,
    return_stats: bool = False,
    overlap_k: int = DEFAULT_OVERLAP_K,
    token_weights: torch.Tensor | None = None,
) -> DistillLoss:
    """Masked SUM over tokens of the generalized JSD of student and teacher coarsened onto the teacher's top-k.

    Args:
        student_hidden: (N, H), differentiable; student_lm_head: (V, H) (+ `student_bias` (V,)).
        teacher_topk_ids: (N, K) token ids; teacher_topk_log_probs: (N, K) their teacher log-probs, already at
            the loss temperature (ask the server for log-probs at `temperature`).
        mask: (N,) bool, True where the token is trained on.
        sampled_ids: (N,) the completion token at each position; with `teacher_sampled_log_probs` (N,) it joins
            the support where the top-k missed it.
        teacher_tail_log_probs: (N,) log of the teacher's mass outside the support, when known exactly (a
            cache); otherwise log(1 - reported mass), floored at `min_tail_mass`.
        tail: coarsen with a tail bucket (True) or renormalise both on the support (False).
        token_weights: (N,) constants weighting each token's loss (importance weights), or None.
        temperature: divides the student logits (the teacher's are given at that temperature).

    Returns:
        DistillLoss(loss_sum, num_tokens, stats); stats use the coarsened distributions for the teacher's
        entropy (a lower bound) and both KLs, the full student distribution for its entropy and top-k.
    """
    beta = check_beta(beta)
    temperature = check_temperature(temperature)
    chunk_size = check_chunk_size(chunk_size)
    check_matrix("student_hidden", student_hidden)
    n = student_hidden.shape[0]
    check_matrix("student_lm_head", student_lm_head, cols=student_hidden.shape[1])
    vocab = student_lm_head.shape[0]
    check_matrix("teacher_topk_ids", teacher_topk_ids, rows=n)
    k = teacher_topk_ids.shape[1]
    check_matrix("teacher_topk_log_probs", teacher_topk_log_probs, rows=n, cols=k)
    _check_ids("teacher_topk_ids", teacher_topk_ids, vocab)
    if k < 1 or k > vocab:
        raise ValueError(f"teacher_topk_ids must hold between 1 and V={vocab} ids per position, got {k}")
    if (sampled_ids is None) != (teacher_sampled_log_probs is None):
        raise ValueError("sampled_ids and teacher_sampled_log_probs must be given together (or neither)")
    if sampled_ids is not None:
        _check_vector("sampled_ids", sampled_ids, n)
        _check_vector("teacher_sampled_log_probs", teacher_sampled_log_probs, n)
        _check_ids("sampled_ids", sampled_ids, vocab)
    if teacher_tail_log_probs is not None:
        if not tail:
            raise ValueError("teacher_tail_log_probs is only used with tail=True; drop it or set tail=True")
        _check_vector("teacher_tail_log_probs", teacher_tail_log_probs, n)
    if not 0.0 < min_tail_mass < 1.0:
        raise ValueError(f"min_tail_mass must be in (0, 1), got {min_tail_mass!r}")
    mask = check_mask(mask, n)

    support_ids, teacher_lp, valid = teacher_cells(
        teacher_topk_ids, teacher_topk_log_probs, sampled_ids, teacher_sampled_log_probs, teacher_tail_log_probs, tail, min_tail_mass
    )
    student_head = LogitHead(student_lm_head, student_bias, student_logit_scale, student_softcap)
    overlap = min(overlap_k, vocab) if return_stats else None

    def make_objective(valid_rows: torch.Tensor) -> ChunkObjective:
        rows_ids, rows_lp, rows_valid = (t.index_select(0, valid_rows) for t in (support_ids, teacher_lp, valid))

        def objective(rows: slice, student_logits: torch.Tensor, need_grad: bool):
            return sparse_block(student_logits, rows_ids[rows], rows_lp[rows], rows_valid[rows], beta, tail, need_grad, overlap, k)

        return objective

    return run_chunked(student_hidden, student_head, mask, make_objective, temperature, chunk_size, return_stats,
                       token_weights)


def _check_ids(name: str, ids: torch.Tensor, vocab: int) -> None:
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor, got {ids.dtype}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab}): min {int(ids.min())}, max {int(ids.max())}")


def _check_vector(name: str, tensor: torch.Tensor, n: int) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.shape != (n,):
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name} must have shape ({n},), got {shape}")
