"""Universal Logit Distillation (ULD) and hybrid ULD on aligned token groups, from hidden states, chunked.

The student and the teacher tokenize a completion differently; `distill.align` cuts it into groups of
consecutive tokens spelling the same bytes on both sides. A group of tokens x_a..x_b gets one vector per
side by the chain rule, each conditional read at the position that predicts its token:

    m(v) = P(x_a .. x_{b-1}, v) = p_a(x_a) ... p_{b-1}(x_{b-1}) * p_b(v)        (sums to P(prefix) <= 1)

with p_k = softmax(z_k / T). The two vectors live on different vocabularies, so they are compared:
    ULD (Boizard et al., arXiv 2402.12030): sum_i |sort(m_s)_i - sort(m_t)_i|, both sorted in decreasing
        order and zero-padded to the larger vocabulary.
    hybrid: tokens whose strings exist in both vocabularies are compared exactly, by the generalized JSD of
        the distributions (m(v) for matched v, plus one cell 1 - sum of those); the other tokens by ULD:
        w_matched * JSD_beta + w_unmatched * ULD(unmatched part).
A group's divergence counts once per student token in it (`group_weight`), so the loss sum is comparable
to a per-token loss and the trainer's denominator (completion tokens of the step) makes it a token mean.
An optional cross-entropy term adds -w_ce log p(x_k) (temperature 1) for every student token trained on.

The chain rule couples the rows of a group, while `ChunkedHeadLoss` wants per-row objectives. Three passes
over rows keep it exact (G groups, c_g = product of the student's earlier conditionals):
    A (no grad)   earlier rows of each group: log p_k(x_k), summed into log c_g;
    B             the last row of each group: the divergence of m_s = c_g * p_b, its gradient for z_b, and
                  dL/d(log c_g) for pass C;
    C             earlier rows: d(log c_g)/dz_k = onehot(x_k) - p_k, times dL/d(log c_g) (value: the CE
                  term only; the divergence was counted in B).
Each pass projects only its own rows, `chunk_size` at a time: no [tokens x vocab] tensor exists.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses.blocks import Workspace
from distill.losses.checks import check_beta, check_chunk_size, check_temperature
from distill.losses.chunked import DistillLoss, LogitHead, run_chunked
from distill.losses.token_log_probs import token_log_probs

_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class VocabularyMatch:
    """Token strings present in both vocabularies: student_ids[i] and teacher_ids[i] spell the same token. (M,) long."""

    student_ids: torch.Tensor
    teacher_ids: torch.Tensor

    @classmethod
    def from_tokenizers(cls, student_tokenizer, teacher_tokenizer, student_vocab: int, teacher_vocab: int) -> "VocabularyMatch":
        student = {token: index for token, index in student_tokenizer.get_vocab().items() if index < student_vocab}
        pairs = sorted((index, student[token]) for token, index in teacher_tokenizer.get_vocab().items()
                       if index < teacher_vocab and token in student)
        return cls(torch.tensor([s for _, s in pairs], dtype=torch.long), torch.tensor([t for t, _ in pairs], dtype=torch.long))

    @property
    def size(self) -> int:
        return int(self.student_ids.numel())

    def to(self, device: torch.device) -> "VocabularyMatch":
        return VocabularyMatch(self.student_ids.to(device), self.teacher_ids.to(device))


@dataclass(frozen=True)
class ULDSettings:
    """hybrid: the matched vocabulary (None = plain ULD); weights of its two parts; cross-entropy weight."""

    hybrid: VocabularyMatch | None = None
    matched_weight: float = 0.0
    unmatched_weight: float = 1.0
    crossentropy_weight: float = 0.0


@dataclass
class Alignment:
    """Which aligned group each student row belongs to.

    row_group: (N,) long, the group of each completion-predicting student row, -1 when it is not trained on
        (no teacher counterpart); a group's rows are consecutive.
    row_last: (N,) bool, the row predicts the last student token of its group.
    group_weight: (G,) float32, the number of student tokens in each group.
    """

    row_group: torch.Tensor
    row_last: torch.Tensor
    group_weight: torch.Tensor

    def to(self, device: torch.device) -> "Alignment":
        return Alignment(self.row_group.to(device), self.row_last.to(device), self.group_weight.to(device))


def sorted_l1(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """(C,) sum_i |sort(student)_i - sort(teacher)_i|, decreasing order, the shorter side zero-padded."""
    s = student.sort(dim=-1, descending=True).values
    t = teacher.sort(dim=-1, descending=True).values
    width = max(s.shape[-1], t.shape[-1])
    s = torch.nn.functional.pad(s, (0, width - s.shape[-1]))
    t = torch.nn.functional.pad(t, (0, width - t.shape[-1]))
    return (s - t).abs().sum(dim=-1)


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row, 0 log 0 = 0; the clamps keep the gradient finite where a probability underflows."""
    return (torch.xlogy(p, p.clamp_min(_TINY)) - torch.xlogy(p, q.clamp_min(_TINY))).sum(dim=-1)


def generalized_jsd_probs(p_student: torch.Tensor, p_teacher: torch.Tensor, beta: float) -> torch.Tensor:
    """(C,) generalized JSD of two distributions given as probabilities; beta 0 / 1 are forward / reverse KL exactly."""
    if beta == 0.0:
        return _kl(p_teacher, p_student)
    if beta == 1.0:
        return _kl(p_student, p_teacher)
    mixture = (1.0 - beta) * p_student + beta * p_teacher
    return beta * _kl(p_teacher, mixture) + (1.0 - beta) * _kl(p_student, mixture)


def group_divergence(student: torch.Tensor, teacher: torch.Tensor, settings: ULDSettings, beta: float) -> torch.Tensor:
    """(C,) divergence of merged group vectors: student (C, V_s), teacher (C, V_t), unnormalised (sum <= 1)."""
    match = settings.hybrid
    if match is None:
        return sorted_l1(student, teacher)

    def matched_distribution(m: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        cells = m.index_select(1, ids)
        rest = (1.0 - cells.sum(dim=-1, keepdim=True)).clamp_min(0.0)
        return torch.cat([cells, rest], dim=-1)

    def unmatched(m: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(m.shape[-1], dtype=torch.bool, device=m.device)
        keep[ids] = False
        return m[:, keep]

    jsd = generalized_jsd_probs(matched_distribution(student, match.student_ids), matched_distribution(teacher, match.teacher_ids), beta)
    uld = sorted_l1(unmatched(student, match.student_ids), unmatched(teacher, match.teacher_ids))
    return settings.matched_weight * jsd + settings.unmatched_weight * uld


def chunked_uld(
    student_hidden: torch.Tensor,
    student_head: LogitHead,
    targets: torch.Tensor,
    alignment: Alignment,
    teacher_hidden: torch.Tensor,
    teacher_head: LogitHead,
    teacher_log_prefix: torch.Tensor,
    settings: ULDSettings,
    *,
    beta: float,
    temperature: float,
    chunk_size: int,
) -> DistillLoss:
    """SUM over aligned groups of (student tokens in the group) x divergence, plus the optional CE term.

    Args:
        student_hidden: (N, H_s) at the completion-predicting positions, differentiable; targets: (N,) long.
        student_head: the student's lm_head (V_s rows).
        alignment: the group of every student row (see `Alignment`), G groups.
        teacher_hidden: (G, H_t), the teacher's hidden state at the position predicting each group's last
            teacher token; teacher_head: its lm_head (V_t rows). No gradient flows to the teacher.
        teacher_log_prefix: (G,) sum of the teacher's log-probs (at `temperature`) of each group's earlier tokens.
        settings: plain or hybrid ULD, weights, cross-entropy weight; beta: the hybrid's JSD interpolation.

    Returns DistillLoss(loss_sum, num_tokens = student rows in some group, stats None): the statistics of the
    same-vocabulary losses (entropies, KLs, top-1 agreement) do not exist across vocabularies.
    """
    beta = check_beta(beta)
    temperature = check_temperature(temperature)
    chunk_size = check_chunk_size(chunk_size)
    device = student_hidden.device
    n = student_hidden.shape[0]
    if alignment.row_group.shape != (n,) or targets.shape != (n,):
        raise ValueError(f"chunked_uld: {n} student rows, but the alignment covers {tuple(alignment.row_group.shape)} "
                         f"and the targets {tuple(targets.shape)}")
    groups = teacher_hidden.shape[0]
    if teacher_log_prefix.shape != (groups,) or alignment.group_weight.shape != (groups,):
        raise ValueError(f"chunked_uld: {groups} teacher groups, but teacher_log_prefix has shape "
                         f"{tuple(teacher_log_prefix.shape)} and group_weight {tuple(alignment.group_weight.shape)}")
    trained = alignment.row_group >= 0
    last = trained & alignment.row_last
    inner = trained & ~alignment.row_last
    row_group = alignment.row_group.clamp_min(0)
    teacher_head = LogitHead(teacher_head.weight.detach(), None if teacher_head.bias is None else teacher_head.bias.detach(),
                             teacher_head.scale, teacher_head.softcap)
    match = settings.hybrid.to(device) if settings.hybrid is not None else None
    settings = ULDSettings(match, settings.matched_weight, settings.unmatched_weight, settings.crossentropy_weight)
    ce_weight = settings.crossentropy_weight

    student_log_prefix = torch.zeros(groups, dtype=torch.float32, device=device)
    if inner.any():
        inner_log_probs = token_log_probs(student_hidden, student_head, targets, temperature, chunk_size, inner)
        student_log_prefix.index_add_(0, row_group[inner], inner_log_probs)
    teacher_log_prefix = teacher_log_prefix.to(device, torch.float32)
    group_weight = alignment.group_weight.to(device, torch.float32)
    d_log_prefix = torch.zeros(groups, dtype=torch.float32, device=device)

    def make_last_objective(valid_rows):
        row_groups = row_group.index_select(0, valid_rows)
        row_targets = targets.index_select(0, valid_rows)
        teacher_rows = teacher_hidden.detach().index_select(0, row_groups)
        workspace = Workspace(min(chunk_size, valid_rows.numel()), teacher_head.vocab_size, device)

        def objective(rows, logits, need_grad):
            g = row_groups[rows]
            teacher_logits = workspace.get("teacher_logits", logits.shape[0])
            teacher_head.project(teacher_rows[rows], temperature, out=teacher_logits)
            teacher_merged = torch.softmax(teacher_logits, dim=-1).mul_(teacher_log_prefix[g].exp().unsqueeze(1))
            with torch.enable_grad():
                z = logits.detach().requires_grad_(need_grad)
                log_prefix = student_log_prefix[g].clone().requires_grad_(need_grad)
                merged = (torch.log_softmax(z, dim=-1) + log_prefix.unsqueeze(1)).exp()
                loss = group_weight[g] * group_divergence(merged, teacher_merged, settings, beta)
                if ce_weight:
                    ce = -torch.log_softmax(z * temperature, dim=-1).gather(1, row_targets[rows].unsqueeze(1)).squeeze(1)
                    loss = loss + ce_weight * ce
                grad = None
                if need_grad:
                    grad, d_prefix = torch.autograd.grad(loss.sum(), [z, log_prefix])
                    d_log_prefix[g] = d_prefix
            return loss.detach(), grad, None

        return objective

    out = run_chunked(student_hidden, student_head, last, make_last_objective, temperature, chunk_size, False)
    loss_sum = out.loss_sum
    if inner.any() and (torch.is_grad_enabled() or ce_weight):

        def make_inner_objective(valid_rows):
            row_groups = row_group.index_select(0, valid_rows)
            row_targets = targets.index_select(0, valid_rows).unsqueeze(1)

            def objective(rows, logits, need_grad):
                with torch.enable_grad():
                    z = logits.detach().requires_grad_(need_grad)
                    target = row_targets[rows]
                    # d log c_g / d z_k = d log p_k(x_k) / d z_k: the chain rule's earlier factors.
                    surrogate = d_log_prefix[row_groups[rows]] * torch.log_softmax(z, dim=-1).gather(1, target).squeeze(1)
                    ce = -ce_weight * torch.log_softmax(z * temperature, dim=-1).gather(1, target).squeeze(1) if ce_weight else torch.zeros_like(surrogate)
                    grad = torch.autograd.grad((surrogate + ce).sum(), z)[0] if need_grad else None
                return ce.detach(), grad, None

            return objective

        loss_sum = loss_sum + run_chunked(student_hidden, student_head, inner, make_inner_objective, temperature, chunk_size, False).loss_sum
    return DistillLoss(loss_sum, trained.sum().to(torch.long).cpu(), None)
