"""Self-distillation and SFT losses against naive float64 twins (values and gradients), and TRL's SDFT losses.

- cross-entropy (sft), chunked, vs -log of softmax probabilities;
- the student's top-k + tail support fed to the sparse path vs the coarsened distributions built by hand;
- token weights (importance weights) on the dense and the sparse path vs the weighted naive sum;
- the objective's three modes and its importance weights vs the definitions, and vs TRL 1.16.0's
  `sdft/loss_utils.py` on the same logits.
"""

from __future__ import annotations

import pytest
import torch

from distill.losses import LogitHead, chunked_generalized_jsd, sparse_generalized_jsd
from distill.losses.cross_entropy import chunked_cross_entropy
from distill.losses.student_topk import student_topk_support
from distill.objectives import StepContext, StudentTokens
from distill.objectives.self_distillation import (
    SelfDistillationObjective,
    SelfDistillationSettings,
)
from distill.signals import DenseSignal
from tests.losses import reference
from tests.skip_guard import needs_extra


def problem(seed: int, n: int = 19, hidden: int = 8, vocab: int = 29, teacher_hidden: int = 6):
    generator = torch.Generator().manual_seed(seed)
    return dict(
        student=torch.randn(n, hidden, generator=generator),
        weight=torch.randn(vocab, hidden, generator=generator) * 0.8,
        bias=torch.randn(vocab, generator=generator) * 0.1,
        teacher=torch.randn(n, teacher_hidden, generator=generator),
        teacher_weight=torch.randn(vocab, teacher_hidden, generator=generator) * 0.8,
        targets=torch.randint(0, vocab, (n,), generator=generator),
        weights=torch.rand(n, generator=generator) * 2.0,
    )


def leaves(p, dtype=torch.float32):
    """Fresh differentiable copies of the student's hidden states, lm_head weight and bias."""
    return [p[name].detach().to(dtype).clone().requires_grad_() for name in ("student", "weight", "bias")]


def grads(loss, tensors):
    return torch.autograd.grad(loss, tensors)


# ---------------------------------------------------------------------------------------------- sft --
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_cross_entropy_matches_the_definition(chunk):
    p = problem(0)
    hidden, weight, bias = leaves(p)
    out = chunked_cross_entropy(hidden, LogitHead(weight, bias), p["targets"], chunk)
    ref_leaves = leaves(p, torch.float64)
    probabilities = reference.probs(reference.head_logits(ref_leaves[0], ref_leaves[1], ref_leaves[2]))
    expected = -torch.log(probabilities.gather(1, p["targets"].unsqueeze(1))).sum()
    torch.testing.assert_close(out.loss_sum.double(), expected, rtol=1e-5, atol=1e-5)
    assert int(out.num_tokens) == p["targets"].numel()
    for got, want in zip(grads(out.loss_sum, [hidden, weight, bias]), grads(expected, ref_leaves)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_chunked_cross_entropy_of_no_tokens_is_zero_with_zero_gradient():
    p = problem(1, n=0)
    hidden, weight, bias = leaves(p)
    out = chunked_cross_entropy(hidden, LogitHead(weight, bias), p["targets"], 8)
    assert float(out.loss_sum.detach()) == 0.0 and int(out.num_tokens) == 0
    assert torch.equal(grads(out.loss_sum, [weight])[0], torch.zeros_like(weight))


# ------------------------------------------------------------------------------------ top-k + tail --
def naive_topk_jsd(p, k: int, beta: float, temperature: float, leaves64):
    """Per token: both distributions coarsened onto the student's top-k ids + one tail cell, then the JSD."""
    student = reference.probs(reference.head_logits(*leaves64), temperature)
    teacher = reference.probs(reference.head_logits(p["teacher"], p["teacher_weight"]), temperature)
    ids = student.detach().topk(k, dim=-1).indices
    cells = [[[int(i)] for i in row] for row in ids]
    s_cells, t_cells = reference.coarsen(student, cells, tail=True), reference.coarsen(teacher, cells, tail=True)
    return torch.stack([reference.jsd(s.unsqueeze(0), t.unsqueeze(0), beta).squeeze(0) for s, t in zip(s_cells, t_cells)])


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_student_topk_support_with_the_sparse_path_matches_coarsened_distributions(beta, temperature):
    p, k = problem(2), 5
    hidden, weight, bias = leaves(p)
    head = LogitHead(weight, bias)
    ids, teacher_lp, tail = student_topk_support(hidden, head, p["teacher"], LogitHead(p["teacher_weight"]), k, temperature, 4)
    out = sparse_generalized_jsd(hidden, weight, ids, teacher_lp, teacher_tail_log_probs=tail, beta=beta,
                                 temperature=temperature, chunk_size=4, student_bias=bias, token_weights=p["weights"])
    ref_leaves = leaves(p, torch.float64)
    expected = (naive_topk_jsd(p, k, beta, temperature, ref_leaves) * p["weights"].double()).sum()
    torch.testing.assert_close(out.loss_sum.double(), expected, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads(out.loss_sum, [hidden, weight, bias]), grads(expected, ref_leaves)):
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-5)


def test_student_topk_support_is_the_students_top_k_and_the_teachers_exact_tail():
    p, k = problem(3), 4
    head = LogitHead(p["weight"], p["bias"])
    ids, teacher_lp, tail = student_topk_support(p["student"], head, p["teacher"], LogitHead(p["teacher_weight"]), k, 1.0, 3)
    student = reference.probs(reference.head_logits(p["student"], p["weight"], p["bias"]))
    teacher = reference.probs(reference.head_logits(p["teacher"], p["teacher_weight"]))
    assert torch.equal(ids.sort(dim=1).values, student.topk(k, dim=-1).indices.sort(dim=1).values)
    torch.testing.assert_close(teacher_lp.double(), teacher.gather(1, ids).log(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tail.double(), (1 - teacher.gather(1, ids).sum(1)).log(), rtol=1e-5, atol=1e-6)
    assert ids.dtype == torch.long


# ---------------------------------------------------------------------------------- token weights --
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_token_weights_on_the_dense_path_weight_each_tokens_loss_and_gradient(beta):
    p = problem(4)
    hidden, weight, bias = leaves(p)
    mask = torch.arange(p["student"].shape[0]) % 4 != 1
    out = chunked_generalized_jsd(hidden, weight, p["teacher"], p["teacher_weight"], mask, beta=beta, temperature=1.3,
                                  chunk_size=3, student_bias=bias, token_weights=p["weights"], return_stats=True)
    ref_leaves = leaves(p, torch.float64)
    student = reference.probs(reference.head_logits(*ref_leaves), 1.3)
    teacher = reference.probs(reference.head_logits(p["teacher"], p["teacher_weight"]), 1.3)
    expected = (reference.jsd(student, teacher, beta) * p["weights"].double() * mask.double()).sum()
    torch.testing.assert_close(out.loss_sum.double(), expected, rtol=1e-5, atol=1e-6)
    for got, want in zip(grads(out.loss_sum, [hidden, weight, bias]), grads(expected, ref_leaves)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)
    # the diagnostics are the unweighted distributions'
    torch.testing.assert_close(out.stats.forward_kl[mask].double(), reference.kl(teacher, student)[mask], rtol=1e-4, atol=1e-6)


def test_token_weights_of_the_wrong_shape_are_refused():
    p = problem(5)
    with pytest.raises(ValueError, match=r"token_weights must have shape \(19,\)"):
        chunked_generalized_jsd(p["student"], p["weight"], p["teacher"], p["teacher_weight"], token_weights=torch.ones(3))


# ------------------------------------------------------------------------------ the objective's modes --
def tokens_and_signal(p, dtype=torch.float32, rollout=None):
    hidden, weight, bias = leaves(p, dtype)
    tokens = StudentTokens(hidden, LogitHead(weight, bias), p["targets"], torch.zeros_like(p["targets"]), rollout)
    return tokens, DenseSignal(p["teacher"], LogitHead(p["teacher_weight"])), (hidden, weight, bias)


def test_sampled_token_mode_is_reinforce_on_the_reverse_kl_estimate():
    """Value: sum_t log pi_S(y_t) - log pi_T(y_t); gradient: sum_t sg[log pi_S - log pi_T] grad log pi_S (the
    REINFORCE estimator of reverse KL's gradient, TRL's `log_ratio.detach() * student_logps`)."""
    p = problem(6)
    tokens, signal, student_leaves = tokens_and_signal(p)
    objective = SelfDistillationObjective(SelfDistillationSettings("sampled_token", 1.0, 1.0, 4))
    out = objective(tokens, signal, StepContext("student"))
    ref_leaves = leaves(p, torch.float64)
    student_lp = reference.probs(reference.head_logits(*ref_leaves)).gather(1, p["targets"].unsqueeze(1)).squeeze(1).log()
    teacher_lp = reference.probs(reference.head_logits(p["teacher"], p["teacher_weight"])).gather(
        1, p["targets"].unsqueeze(1)).squeeze(1).log()
    torch.testing.assert_close(out.loss_sum.double(), (student_lp - teacher_lp).sum(), rtol=1e-5, atol=1e-5)
    surrogate = ((student_lp - teacher_lp).detach() * student_lp).sum()
    for got, want in zip(grads(out.loss_sum, list(student_leaves)), grads(surrogate, ref_leaves)):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode, beta", [("full_logits", 0.0), ("full_logits", 0.5), ("topk_logits", 1.0), ("sampled_token", 1.0)])
def test_reused_rollouts_weight_each_token_by_its_capped_importance_ratio(mode, beta):
    p = problem(7)
    generator = torch.Generator().manual_seed(1)
    current = reference.probs(reference.head_logits(p["student"], p["weight"], p["bias"])).gather(
        1, p["targets"].unsqueeze(1)).squeeze(1).log().float()
    old = current - torch.randn(current.shape, generator=generator)  # pi_theta / pi_old = exp(N(0, 1))
    settings = SelfDistillationSettings(mode, beta, 1.0, 4, topk=6, is_clip=1.5, reused_rollouts=True)
    tokens, signal, student_leaves = tokens_and_signal(p, rollout=old)
    out = SelfDistillationObjective(settings)(tokens, signal, StepContext("student", staleness=1))
    expected_weights = (current - old).exp().clamp_max(1.5)
    assert float(out.metrics["self_distillation/is_capped"][0]) == float((expected_weights >= 1.5).sum()) > 0
    torch.testing.assert_close(out.metrics["self_distillation/is_weight"][0], expected_weights.sum(), rtol=1e-5, atol=1e-5)
    # the same loss with those weights given explicitly to the unweighted objective's path
    fresh = SelfDistillationObjective(SelfDistillationSettings(mode, beta, 1.0, 4, topk=6))
    tokens2, signal2, leaves2 = tokens_and_signal(p)
    per_token = []
    for i in range(p["targets"].numel()):  # one-token problems: each token's unweighted loss and gradient
        index = torch.tensor([i])
        per_token.append(fresh(tokens2.select(index), DenseSignal(signal2.hidden[index], signal2.head), StepContext("student")).loss_sum)
    expected = (torch.stack(per_token) * expected_weights).sum()
    torch.testing.assert_close(out.loss_sum, expected, rtol=1e-4, atol=1e-5)
    for got, want in zip(grads(out.loss_sum, list(student_leaves)), grads(expected, list(leaves2))):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-5)


def test_fresh_rollouts_and_teacher_samples_get_no_importance_weight():
    p = problem(8)
    old = torch.full((p["targets"].numel(),), -5.0)
    for settings, source in ((SelfDistillationSettings("full_logits", 0.0, reused_rollouts=False), "student"),
                             (SelfDistillationSettings("full_logits", 0.0, reused_rollouts=True), "teacher")):
        tokens, signal, _ = tokens_and_signal(p, rollout=old)
        weighted = SelfDistillationObjective(settings)(tokens, signal, StepContext(source))
        tokens, signal, _ = tokens_and_signal(p)
        plain = SelfDistillationObjective(SelfDistillationSettings("full_logits", 0.0))(tokens, signal, StepContext(source))
        assert torch.equal(weighted.loss_sum, plain.loss_sum)
        assert "self_distillation/is_weight" not in weighted.metrics


@pytest.mark.parametrize("mode, beta", [("full_logits", 0.0), ("topk_logits", 1.0), ("sampled_token", 1.0)])
def test_the_first_step_of_a_reuse_window_gets_no_importance_weight_whatever_the_recorded_precision(mode, beta):
    """num_iterations > 1: log-probs recorded at generation in another precision (simulated: off by up to 0.3
    nats) make no importance weight on the window's first step, which equals a num_iterations 1 step exactly."""
    p = problem(12)
    generator = torch.Generator().manual_seed(4)
    current = reference.probs(reference.head_logits(p["student"], p["weight"], p["bias"])).gather(
        1, p["targets"].unsqueeze(1)).squeeze(1).log().float()
    recorded = current + 0.3 * (2 * torch.rand(current.shape, generator=generator) - 1)
    results = {}
    for name, reused, fresh in (("plain", False, True), ("first", True, True), ("later", True, False)):
        tokens, signal, student_leaves = tokens_and_signal(p, rollout=recorded)
        settings = SelfDistillationSettings(mode, beta, 1.0, 4, topk=6, is_clip=None, reused_rollouts=reused)
        out = SelfDistillationObjective(settings)(tokens, signal, StepContext("student", staleness=0 if fresh else 1))
        results[name] = (out, grads(out.loss_sum, list(student_leaves)))
    (plain, plain_grads), (first, first_grads), (later, _) = results["plain"], results["first"], results["later"]
    assert torch.equal(first.loss_sum, plain.loss_sum) and all(torch.equal(a, b) for a, b in zip(first_grads, plain_grads))
    assert "self_distillation/is_weight" not in first.metrics and "self_distillation/is_weight" in later.metrics
    assert not torch.isclose(later.loss_sum, plain.loss_sum, rtol=1e-4)


def test_sampled_token_mode_refuses_beta_other_than_one():
    with pytest.raises(ValueError, match="sampled_token estimates reverse KL on the sampled token only: set beta: 1"):
        SelfDistillationSettings("sampled_token", 0.5)


# ----------------------------------------------------------------------------------- TRL parity --
@pytest.mark.parametrize("mode, beta", [("full_logits", 0.0), ("full_logits", 0.5), ("full_logits", 1.0),
                                        ("topk_logits", 0.0), ("topk_logits", 0.5), ("sampled_token", 1.0)])
def test_the_objective_matches_trl_sdft_losses(mode, beta):
    """TRL 1.16.0's per-token SDFT losses (`compute_*_self_distillation_loss`, with add_tail for top-k) summed,
    on logits built from the same hidden states: values, and gradients w.r.t. the student's hidden states.
    (TRL's sampled-token value is sg[log_ratio] * log p; only its gradient is comparable.)"""
    trl_losses = needs_extra("trl.experimental.sdft.loss_utils", "trl")
    p, k = problem(9), 7
    tokens, signal, (hidden, weight, bias) = tokens_and_signal(p)
    out = SelfDistillationObjective(SelfDistillationSettings(mode, beta, 1.0, 5, topk=k))(tokens, signal, StepContext("student"))
    ref_hidden = p["student"].clone().requires_grad_()
    student_logits = (ref_hidden @ p["weight"].T + p["bias"]).unsqueeze(0)
    teacher_logits = (p["teacher"] @ p["teacher_weight"].T).unsqueeze(0)
    if mode == "full_logits":
        theirs = trl_losses.compute_full_logit_self_distillation_loss(student_logits, teacher_logits, distillation_alpha=beta)
    elif mode == "topk_logits":
        theirs = trl_losses.compute_topk_self_distillation_loss(student_logits, teacher_logits, distillation_topk=k,
                                                                distillation_alpha=beta, distillation_add_tail=True)
    else:
        theirs = trl_losses.compute_sampled_token_self_distillation_loss(student_logits, teacher_logits,
                                                                         p["targets"].unsqueeze(0), distillation_alpha=1.0)
    if mode != "sampled_token":
        torch.testing.assert_close(out.loss_sum, theirs.sum(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads(out.loss_sum, [hidden])[0], grads(theirs.sum(), [ref_hidden])[0], rtol=1e-3, atol=1e-5)
