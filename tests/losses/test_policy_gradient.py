"""The chunked sampled-token policy gradient (IW-OPD) against naive float64 twins, and TRL's weights."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from distill.losses import LogitHead
from distill.losses.policy_gradient import (
    ClipSettings,
    chunked_policy_gradient,
    prefix_decayed_weights,
    surrogate,
)
from distill.losses.token_log_probs import token_log_probs
from tests.losses import reference
from tests.skip_guard import needs_extra


def problem(seed: int, n: int = 23, hidden: int = 8, vocab: int = 37):
    generator = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=generator)
    weight = torch.randn(vocab, hidden, generator=generator) * 0.7
    bias = torch.randn(vocab, generator=generator) * 0.1
    targets = torch.randint(0, vocab, (n,), generator=generator)
    return h, weight, bias, targets


def sequences(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.full((length,), row, dtype=torch.long) for row, length in enumerate(lengths)])


def test_prefix_decayed_weights_match_the_loop_definition():
    generator = torch.Generator().manual_seed(0)
    lengths = [5, 1, 7, 3]
    advantages = torch.randn(sum(lengths), generator=generator)
    advantages[5] = 0.0  # a one-token sequence the teacher agrees with: S = eps, P = 0, w = 1 + gamma
    expected = reference.iw_opd_weights([a.tolist() for a in advantages.split(lengths)], 0.5, 1e-8)
    got = prefix_decayed_weights(advantages, sequences(lengths), 0.5, 1e-8)
    torch.testing.assert_close(got.double(), torch.tensor([w for seq in expected for w in seq], dtype=torch.float64))
    assert float(got[0]) == 1.5 and float(got[5]) == 1.5  # each sequence starts at 1 + gamma


def test_rows_without_tokens_and_gamma_zero():
    advantages = torch.tensor([0.3, -0.2, 1.0])
    rows = torch.tensor([0, 0, 2])  # row 1 has no completion token
    torch.testing.assert_close(prefix_decayed_weights(advantages, rows, 0.5, 1e-8), torch.tensor([1.5, 1.2, 1.5]))
    assert torch.equal(prefix_decayed_weights(advantages, rows, 0.0, 1e-8), torch.ones(3))
    assert prefix_decayed_weights(torch.zeros(0), torch.zeros(0, dtype=torch.long), 0.5, 1e-8).shape == (0,)


@pytest.mark.parametrize("chunk", [1, 5, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_clipped_policy_gradient_matches_the_naive_twin(chunk, temperature):
    h, weight, bias, targets = problem(1)
    n = h.shape[0]
    generator = torch.Generator().manual_seed(2)
    exact = reference.probs(reference.head_logits(h, weight, bias), temperature)
    # pi_old away from pi_theta so that the ratio clip and the dual clip both engage somewhere
    old = (exact[torch.arange(n), targets].log() + torch.randn(n, generator=generator, dtype=torch.float64) * 0.6).float()
    advantages = torch.randn(n, generator=generator) * 2
    weights = 1 + torch.rand(n, generator=generator) * 0.5
    clip = ClipSettings(0.2, 0.28, 3.0)
    _, _, clipped = surrogate(exact[torch.arange(n), targets].log().float() - old, advantages, clip)
    assert 0 < int(clipped.sum()) < n

    h64, w64, b64 = (t.double().requires_grad_() for t in (h, weight, bias))
    p = reference.probs(reference.head_logits(h64, w64, b64), temperature)
    naive = reference.clipped_surrogate_loss(p[torch.arange(n), targets], old.tolist(), advantages.tolist(), weights.tolist(),
                                             0.2, 0.28, 3.0)
    naive.backward()

    hc, wc, bc = (t.clone().requires_grad_() for t in (h, weight, bias))
    loss, facts = chunked_policy_gradient(hc, LogitHead(wc, bc), targets, advantages, weights, old, clip,
                                          temperature=temperature, chunk_size=chunk)
    loss.loss_sum.backward()
    torch.testing.assert_close(loss.loss_sum.double(), naive.detach(), rtol=1e-5, atol=1e-5)
    for mine, theirs in ((hc, h64), (wc, w64), (bc, b64)):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(facts["ratio"].double(), p[torch.arange(n), targets].detach() / old.double().exp(), rtol=1e-4, atol=1e-6)
    assert torch.equal(facts["clipped"], clipped)


def test_fresh_rollouts_give_reinforce_with_weights_and_gamma_zero_gives_plain_opd():
    """rho = 1: the gradient is that of -sum w A log pi; with gamma 0 every w is 1 (sampled-token OPD)."""
    h, weight, bias, targets = problem(3)
    n = h.shape[0]
    rows = sequences([9, 14])
    teacher = torch.randn(n, generator=torch.Generator().manual_seed(4)) - 2.0
    for gamma in (0.5, 0.0):
        old = token_log_probs(h, LogitHead(weight, bias), targets, 1.0, 7)
        advantages = teacher - old
        weights = prefix_decayed_weights(advantages, rows, gamma, 1e-8)
        hc, wc = h.clone().requires_grad_(), weight.clone().requires_grad_()
        loss, facts = chunked_policy_gradient(hc, LogitHead(wc, bias), targets, advantages, weights, old, ClipSettings(),
                                              temperature=1.0, chunk_size=7)
        loss.loss_sum.backward()
        assert not bool(facts["clipped"].any())
        h64, w64 = h.double().requires_grad_(), weight.double().requires_grad_()
        log_pi = reference.probs(reference.head_logits(h64, w64, bias))[torch.arange(n), targets].log()
        (-(weights.double() * advantages.double() * log_pi).sum()).backward()
        torch.testing.assert_close(hc.grad.double(), h64.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(wc.grad.double(), w64.grad, rtol=1e-4, atol=1e-6)
        if gamma == 0.0:
            assert torch.equal(weights, torch.ones(n))
        # old None (a fresh rollout, rho = 1 by definition) is the same loss and gradient
        h2 = h.clone().requires_grad_()
        again, facts = chunked_policy_gradient(h2, LogitHead(weight, bias), targets, advantages, weights, None, ClipSettings(),
                                               temperature=1.0, chunk_size=7)
        again.loss_sum.backward()
        assert torch.equal(facts["ratio"], torch.ones(n))
        torch.testing.assert_close(h2.grad, hc.grad, rtol=1e-5, atol=1e-7)


def test_token_log_probs_match_the_definition_and_respect_the_mask():
    h, weight, bias, targets = problem(5)
    exact = reference.probs(reference.head_logits(h, weight, bias), 0.8)[torch.arange(h.shape[0]), targets].log()
    torch.testing.assert_close(token_log_probs(h, LogitHead(weight, bias), targets, 0.8, 4).double(), exact, rtol=1e-5, atol=1e-6)
    mask = torch.arange(h.shape[0]) % 3 == 0
    torch.testing.assert_close(token_log_probs(h, LogitHead(weight, bias), targets, 0.8, 4, mask).double(), exact[mask],
                               rtol=1e-5, atol=1e-6)


def test_no_tokens_is_a_finite_zero():
    loss, facts = chunked_policy_gradient(torch.zeros(0, 8, requires_grad=True), LogitHead(torch.randn(5, 8), None),
                                          torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0), torch.zeros(0),
                                          ClipSettings(), temperature=1.0, chunk_size=4)
    assert float(loss.loss_sum.detach()) == 0.0 and int(loss.num_tokens) == 0 and facts["ratio"].shape == (0,)


@pytest.mark.parametrize("settings, message", [((-0.1, 0.2, 3.0), "epsilon_low"), ((0.2, -0.1, 3.0), "epsilon_high"),
                                               ((0.2, 0.2, 1.0), "dual_clip must be > 1")])
def test_clip_settings_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        ClipSettings(*settings)


def test_weights_advantages_and_gradient_match_trl_iw_opd():
    """trl 1.16.0's `_compute_iw_opd_loss` (REINFORCE, no ratio): where the math coincides (fresh rollouts, no
    clip active) its advantages, weights and gradient w.r.t. the logits equal ours."""
    iw_opd = needs_extra("trl.experimental.iw_opd.iw_opd_trainer", "trl")
    generator = torch.Generator().manual_seed(6)
    batch, length, vocab = 3, 6, 11
    logits = torch.randn(batch, length, vocab, generator=generator)
    tokens = torch.randint(0, vocab, (batch, length), generator=generator)
    lengths = [6, 2, 4]
    labels = tokens.clone()
    for row, valid in enumerate(lengths):
        labels[row, valid:] = -100
    teacher = torch.randn(batch, length, generator=generator) - 2.0
    rollout = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    n = sum(lengths)
    metrics = {"train": {k: [] for k in ("iw_opd/mean_advantage", "iw_opd/mean_abs_advantage", "iw_opd/mean_weight",
                                         "iw_opd/min_weight", "iw_opd/max_weight")}}
    fake = SimpleNamespace(temperature=1.0, iw_opd_gamma=0.5, iw_opd_epsilon=1e-8, model=SimpleNamespace(training=True),
                           _metrics=metrics)
    theirs_logits = logits.clone().requires_grad_()
    loss = iw_opd.IWOPDTrainer._compute_iw_opd_loss(fake, theirs_logits, tokens, labels, teacher, rollout, num_items_in_batch=n)
    loss.backward()

    valid = labels != -100
    advantages = (teacher - rollout)[valid]
    rows = torch.arange(batch).unsqueeze(1).expand(batch, length)[valid]
    weights = prefix_decayed_weights(advantages, rows, 0.5, 1e-8)
    assert metrics["train"]["iw_opd/mean_advantage"][0] == pytest.approx(float((weights * advantages).mean()), rel=1e-5)
    assert metrics["train"]["iw_opd/mean_abs_advantage"][0] == pytest.approx(float(advantages.abs().mean()), rel=1e-5)
    assert metrics["train"]["iw_opd/mean_weight"][0] == pytest.approx(float(weights.mean()), rel=1e-6)
    assert metrics["train"]["iw_opd/min_weight"][0] == pytest.approx(float(weights.min()), rel=1e-6)
    assert metrics["train"]["iw_opd/max_weight"][0] == pytest.approx(float(weights.max()), rel=1e-6)

    # Ours from the logits themselves: an identity "hidden" against an identity head gives z = logits.
    mine_logits = logits[valid].clone().requires_grad_()
    out, _ = chunked_policy_gradient(mine_logits, LogitHead(torch.eye(vocab), None), tokens[valid], advantages, weights,
                                     rollout[valid], ClipSettings(), temperature=1.0, chunk_size=4)
    (out.loss_sum / n).backward()
    torch.testing.assert_close(mine_logits.grad, theirs_logits.grad[valid], rtol=1e-5, atol=1e-7)
    assert torch.equal(theirs_logits.grad[~valid], torch.zeros_like(theirs_logits.grad[~valid]))
