"""Chunked ULD / hybrid ULD (three passes over rows) against the naive float64 chain-rule reference."""

from __future__ import annotations

import pytest
import torch

from distill.losses.chunked import LogitHead
from distill.losses.uld import Alignment, ULDSettings, VocabularyMatch, chunked_uld
from tests.losses.reference import (
    assert_close_relative,
    head_logits,
    uld_groups_reference,
)

# Two sequences: student rows 0-6 and 7-10, teacher rows 0-5 and 6-9. Groups mix 1:1, many:1, 1:many and
# many:many; student row 6 has no teacher counterpart (not trained).
GROUPS = [([0], [0]), ([1, 2], [1]), ([3], [2, 3]), ([4, 5], [4, 5]), ([7], [6]), ([8, 9, 10], [7, 8, 9])]
N_STUDENT, N_TEACHER = 11, 10


def make_inputs(seed: int, vs: int = 23, vt: int = 37, hs: int = 8, ht: int = 6):
    generator = torch.Generator().manual_seed(seed)
    student_hidden = torch.randn(N_STUDENT, hs, generator=generator)
    student_weight = torch.randn(vs, hs, generator=generator) * 0.7
    teacher_hidden = torch.randn(N_TEACHER, ht, generator=generator)
    teacher_weight = torch.randn(vt, ht, generator=generator) * 0.7
    student_targets = torch.randint(0, vs, (N_STUDENT,), generator=generator)
    teacher_targets = torch.randint(0, vt, (N_TEACHER,), generator=generator)
    return student_hidden, student_weight, teacher_hidden, teacher_weight, student_targets, teacher_targets


def chunked_inputs(teacher_hidden, teacher_weight, teacher_targets, temperature):
    """The alignment and teacher-side tensors the cross-tokenizer teacher hands the loss."""
    row_group = torch.full((N_STUDENT,), -1, dtype=torch.long)
    row_last = torch.zeros(N_STUDENT, dtype=torch.bool)
    teacher_log_p = torch.log_softmax(teacher_hidden @ teacher_weight.T / temperature, dim=-1)
    last_teacher, prefix = [], []
    for g, (s_rows, t_rows) in enumerate(GROUPS):
        row_group[s_rows] = g
        row_last[s_rows[-1]] = True
        last_teacher.append(t_rows[-1])
        prefix.append(sum(float(teacher_log_p[r, teacher_targets[r]]) for r in t_rows[:-1]))
    weight = torch.tensor([float(len(s)) for s, _ in GROUPS])
    return Alignment(row_group, row_last, weight), teacher_hidden[last_teacher], torch.tensor(prefix)


CASES = [
    dict(name="uld"),
    dict(name="uld_T2_ce", temperature=2.0, ce_weight=0.3),
    dict(name="hybrid_beta0", hybrid=True, beta=0.0, matched_weight=0.6, unmatched_weight=0.4),
    dict(name="hybrid_beta05", hybrid=True, beta=0.5, matched_weight=0.3, unmatched_weight=0.7),
    dict(name="hybrid_beta1_ce", hybrid=True, beta=1.0, matched_weight=0.5, unmatched_weight=0.5, ce_weight=0.2),
]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
@pytest.mark.parametrize("chunk_size", [2, 64])
def test_chunked_uld_matches_reference(case, chunk_size):
    temperature, beta, ce = case.get("temperature", 1.0), case.get("beta", 0.5), case.get("ce_weight", 0.0)
    sh, sw, th, tw, st, tt = make_inputs(seed=3)
    matched = [(1, 4), (5, 0), (7, 30), (22, 36), (10, 11)] if case.get("hybrid") else None
    want_hidden, want_weight = sh.double().requires_grad_(), sw.double().requires_grad_()
    want = uld_groups_reference(head_logits(want_hidden, want_weight), head_logits(th, tw), st, tt, GROUPS, temperature,
                                matched, case.get("matched_weight", 0.0), case.get("unmatched_weight", 1.0), beta, ce)
    want.backward()

    alignment, teacher_last, teacher_prefix = chunked_inputs(th, tw, tt, temperature)
    match = None
    if matched:
        match = VocabularyMatch(torch.tensor([a for a, _ in matched]), torch.tensor([b for _, b in matched]))
    settings = ULDSettings(match, case.get("matched_weight", 0.0), case.get("unmatched_weight", 1.0), ce)
    got_hidden, got_weight = sh.clone().requires_grad_(), sw.clone().requires_grad_()
    out = chunked_uld(got_hidden, LogitHead(got_weight), st, alignment, teacher_last, LogitHead(tw), teacher_prefix, settings,
                      beta=beta, temperature=temperature, chunk_size=chunk_size)
    out.loss_sum.backward()
    assert int(out.num_tokens) == N_STUDENT - 1
    assert_close_relative(out.loss_sum.detach(), want.detach(), 1e-5, "loss")
    assert_close_relative(got_hidden.grad, want_hidden.grad, 1e-4, "grad hidden")
    assert_close_relative(got_weight.grad, want_weight.grad, 1e-4, "grad head")
    assert got_hidden.grad[6].abs().sum() == 0  # the untrained row gets nothing


def test_uld_is_zero_for_a_relabelled_copy_and_positive_otherwise():
    """ULD compares sorted probabilities: a teacher that is the student with its vocabulary permuted scores 0."""
    sh, sw, *_ = make_inputs(seed=5, vs=17, vt=17)
    permutation = torch.randperm(17, generator=torch.Generator().manual_seed(0))
    student_p, relabelled_p = torch.softmax(sh @ sw.T, -1), torch.softmax(sh @ sw[permutation].T, -1)
    assert (student_p - relabelled_p).abs().sum(-1).min() > 0.1  # token by token the two distributions differ
    alignment = Alignment(torch.arange(N_STUDENT), torch.ones(N_STUDENT, dtype=torch.bool), torch.ones(N_STUDENT))
    targets = torch.zeros(N_STUDENT, dtype=torch.long)
    same = chunked_uld(sh, LogitHead(sw), targets, alignment, sh, LogitHead(sw[permutation]), torch.zeros(N_STUDENT),
                       ULDSettings(), beta=0.5, temperature=1.0, chunk_size=4)
    assert float(same.loss_sum) < 1e-5
    other = chunked_uld(sh, LogitHead(sw), targets, alignment, sh, LogitHead(sw * 3.0), torch.zeros(N_STUDENT),
                        ULDSettings(), beta=0.5, temperature=1.0, chunk_size=4)
    groups = [([i], [i]) for i in range(N_STUDENT)]
    want = uld_groups_reference(head_logits(sh, sw), head_logits(sh, sw * 3.0), targets, targets, groups)
    assert float(want) > 0.1
    assert_close_relative(other.loss_sum.detach(), want, 1e-5, "loss")


def test_empty_alignment_gives_zero_loss_with_a_gradient_path():
    sh = torch.randn(0, 8, requires_grad=True)
    sw = torch.randn(23, 8, requires_grad=True)
    alignment = Alignment(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool), torch.zeros(0))
    out = chunked_uld(sh, LogitHead(sw), torch.zeros(0, dtype=torch.long), alignment, torch.zeros(0, 6), LogitHead(torch.randn(37, 6)),
                      torch.zeros(0), ULDSettings(), beta=0.5, temperature=1.0, chunk_size=4)
    out.loss_sum.backward()
    assert float(out.loss_sum.detach()) == 0.0 and int(out.num_tokens) == 0
    assert torch.equal(sw.grad, torch.zeros_like(sw))
