"""Naive float64 references written from the definitions, in probability space.

Deliberately unlike the code under test: no logsumexp, no F.kl_div (whose argument order is inverted), no
log-space mixture, no chunking. Slow and obviously right.
"""

from __future__ import annotations

import torch


def probs(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """softmax(logits / T) in float64 as exp / sum (inputs in tests are small enough not to overflow)."""
    e = torch.exp(logits.double() / temperature)
    return e / e.sum(dim=-1, keepdim=True)


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim, with 0 log 0 = 0."""
    terms = torch.where(p > 0, p * torch.log(p / q), torch.zeros_like(p))
    return terms.sum(dim=-1)


def jsd(p_student: torch.Tensor, p_teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """Generalized JSD per token: beta=0 forward KL(p_t||p_s), beta=1 reverse KL(p_s||p_t)."""
    if beta == 0:
        return kl(p_teacher, p_student)
    if beta == 1:
        return kl(p_student, p_teacher)
    m = (1 - beta) * p_student + beta * p_teacher
    return beta * kl(p_teacher, m) + (1 - beta) * kl(p_student, m)


def head_logits(hidden, weight, bias=None, scale=1.0, softcap=None):
    """z = softcap * tanh(scale (h W^T + b) / softcap), float64."""
    z = hidden.double() @ weight.double().T
    if bias is not None:
        z = z + bias.double()
    z = z * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    return z


def coarsen(p: torch.Tensor, cells: list[list[list[int]]], tail: bool) -> list[torch.Tensor]:
    """Per row, the probability of each cell (a list of token ids); with tail, one more cell: the rest."""
    out = []
    for row, row_cells in enumerate(cells):
        masses = [p[row, ids].sum() for ids in row_cells]
        if tail:
            covered = torch.zeros(p.shape[1], dtype=torch.bool)
            for ids in row_cells:
                covered[ids] = True
            if not covered.all():
                masses.append(p[row, ~covered].sum())
        vec = torch.stack(masses)
        out.append(vec if tail else vec / vec.sum())
    return out


def sparse_cells(topk_ids: torch.Tensor, sampled_ids: torch.Tensor | None) -> list[list[list[int]]]:
    """The partition's support cells per row: each top-k token, then the sampled one if new."""
    cells = []
    for row in range(topk_ids.shape[0]):
        ids = [[int(i)] for i in topk_ids[row]]
        if sampled_ids is not None and int(sampled_ids[row]) not in {c[0] for c in ids}:
            ids.append([int(sampled_ids[row])])
        cells.append(ids)
    return cells


def assert_close_relative(got: torch.Tensor, want: torch.Tensor, rtol: float, msg: str = "") -> None:
    """max |got - want| <= rtol * max |want|: relative error on the tensor's scale (fp32 rounding of a large
    entry then does not fail a tiny one, as elementwise rtol would)."""
    got, want = got.double(), want.double()
    assert got.shape == want.shape, f"{msg}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    error = (got - want).abs().max().item() if got.numel() else 0.0
    scale = want.abs().max().item() if want.numel() else 0.0
    assert error <= rtol * max(scale, 1e-12), f"{msg}: max error {error:.3e} > {rtol:.0e} x scale {scale:.3e}"


def uld_groups_reference(student_logits, teacher_logits, student_targets, teacher_targets, groups, temperature=1.0,
                         matched=None, matched_weight=0.0, unmatched_weight=1.0, beta=0.5, ce_weight=0.0):
    """ULD / hybrid ULD summed over aligned groups, each counted once per student token, in float64.

    student_logits: (N, V_s) rows predicting student_targets (N,); teacher_logits: (M, V_t) likewise.
    groups: [(student rows, teacher rows)], consecutive rows of one group. matched: None (plain ULD) or
    [(student id, teacher id)] pairs of tokens spelled alike. The merged vector of a group is built
    literally from the chain rule: the product of the earlier tokens' probabilities times the last row's
    distribution.
    """
    p_s, p_t = probs(student_logits, temperature), probs(teacher_logits, temperature)

    def merged(p, targets, rows):
        prefix = torch.ones((), dtype=torch.float64)
        for row in rows[:-1]:
            prefix = prefix * p[row, targets[row]]
        return prefix * p[rows[-1]]

    def sorted_desc_padded(v, width):
        s = torch.sort(v, descending=True).values
        return torch.cat([s, torch.zeros(width - s.numel(), dtype=torch.float64)])

    total = torch.zeros((), dtype=torch.float64)
    for s_rows, t_rows in groups:
        ms, mt = merged(p_s, student_targets, s_rows), merged(p_t, teacher_targets, t_rows)
        if matched is None:
            width = max(ms.numel(), mt.numel())
            divergence = (sorted_desc_padded(ms, width) - sorted_desc_padded(mt, width)).abs().sum()
        else:
            s_ids = [a for a, _ in matched]
            t_ids = [b for _, b in matched]
            cs = torch.cat([ms[s_ids], (1 - ms[s_ids].sum()).reshape(1)])
            ct = torch.cat([mt[t_ids], (1 - mt[t_ids].sum()).reshape(1)])
            us = ms[[i for i in range(ms.numel()) if i not in set(s_ids)]]
            ut = mt[[i for i in range(mt.numel()) if i not in set(t_ids)]]
            width = max(us.numel(), ut.numel())
            uld = (sorted_desc_padded(us, width) - sorted_desc_padded(ut, width)).abs().sum()
            divergence = matched_weight * jsd(cs.unsqueeze(0), ct.unsqueeze(0), beta)[0] + unmatched_weight * uld
        total = total + len(s_rows) * divergence
        if ce_weight:
            p_raw = probs(student_logits, 1.0)
            for row in s_rows:
                total = total - ce_weight * torch.log(p_raw[row, student_targets[row]])
    return total


def iw_opd_weights(advantages: list[list[float]], gamma: float, epsilon: float) -> list[list[float]]:
    """IW-OPD's w_t = 1 + gamma (1 - P_t / S) per sequence, by explicit loops over each sequence's tokens."""
    out = []
    for sequence in advantages:
        total = max(sum(abs(a) for a in sequence), epsilon)
        before, weights = 0.0, []
        for a in sequence:
            weights.append(1.0 + gamma * (1.0 - before / total))
            before += abs(a)
        out.append(weights)
    return out


def clipped_surrogate_loss(student_probs_at_token, old_log_probs, advantages, weights, epsilon_low, epsilon_high, dual_clip):
    """-sum_t w_t s_t with s_t PPO's clipped surrogate (and the dual clip for A < 0), float64, per token in a loop.

    student_probs_at_token: (N,) float64 probabilities pi_theta(y_t), differentiable."""
    total = torch.zeros((), dtype=torch.float64)
    for t in range(student_probs_at_token.shape[0]):
        ratio = student_probs_at_token[t] / torch.exp(torch.tensor(float(old_log_probs[t]), dtype=torch.float64))
        a = float(advantages[t])
        s = torch.minimum(ratio * a, torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high) * a)
        if dual_clip is not None and a < 0:
            s = torch.maximum(s, torch.tensor(dual_clip * a, dtype=torch.float64))
        total = total - float(weights[t]) * s
    return total
