"""The group policy loss (GRPO-style, sdpo's policy part) against a naive twin written from each loss_type's
definition over the whole step (float64, probability space), values and gradients, with the step split into
micro-batches the way the trainer does (every loss sum divided by the step's token count)."""

from __future__ import annotations

import pytest
import torch

from distill.losses import LogitHead
from distill.losses.policy_gradient import ClipSettings
from distill.objectives.base import StepContext, StudentTokens
from distill.objectives.group_policy import (
    LOSS_TYPES,
    PolicySettings,
    group_policy_loss,
)

VOCAB, HIDDEN, MAX_NEW = 23, 8, 7


def step_rows(seed: int = 0):
    """Six rows of unequal lengths (1..6 tokens), their advantages, in two micro-batches of 3 rows."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [3, 1, 6, 2, 5, 4]
    rows = []
    head = torch.randn(VOCAB, HIDDEN, generator=generator, dtype=torch.float64)
    for length in lengths:
        hidden = torch.randn(length, HIDDEN, generator=generator, dtype=torch.float64)
        targets = torch.randint(0, VOCAB, (length,), generator=generator)
        picked = torch.log_softmax(hidden @ head.T, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
        # pi_old near pi_theta: ratios exp(-+0.5) on both sides of the clip range [0.8, 1.28]
        old = picked + torch.rand(length, generator=generator, dtype=torch.float64).sub(0.5)
        rows.append({"hidden": hidden, "targets": targets, "old": old,
                     "advantage": float(torch.randn((), generator=generator, dtype=torch.float64))})
    return rows, head, [rows[:3], rows[3:]]


def naive_loss(rows, head, loss_type: str, micro_batches, reused: bool, clip: ClipSettings) -> torch.Tensor:
    """The loss of the step from its definition: per token l = -min(rho A, clip(rho) A), normalised."""
    def token_losses(row):
        p = torch.softmax(row["hidden"] @ head.T, dim=-1)
        picked = p.gather(1, row["targets"].unsqueeze(1)).squeeze(1).log()
        old = row["old"] if reused else picked.detach()
        rho = (picked - old).exp()
        a = row["advantage"]
        return -torch.minimum(rho * a, rho.clamp(1 - clip.epsilon_low, 1 + clip.epsilon_high) * a)

    losses = [token_losses(row) for row in rows]
    tokens = sum(len(loss) for loss in losses)
    if loss_type == "grpo":
        return sum(loss.mean() for loss in losses) / len(rows)
    if loss_type == "dr_grpo":
        return sum(loss.sum() for loss in losses) / (len(rows) * MAX_NEW)
    if loss_type == "dapo":
        return sum(loss.sum() for loss in losses) / tokens
    means, start = [], 0
    for mb in micro_batches:  # bnpo: each micro-batch's token mean, averaged
        mb_losses = losses[start : start + len(mb)]
        means.append(sum(loss.sum() for loss in mb_losses) / sum(len(loss) for loss in mb_losses))
        start += len(mb)
    return sum(means) / len(means)


def chunked_loss(rows, head, loss_type: str, micro_batches, reused: bool, clip: ClipSettings,
                 window_start: bool = False) -> torch.Tensor:
    """The trainer's way: per micro-batch loss sums (float32 inputs), each divided by the step's tokens.
    reused: num_iterations > 1, on a later step of the reuse window unless `window_start`."""
    settings = PolicySettings(loss_type, clip, 1.0, 4, MAX_NEW, reused)
    step_tokens = sum(len(r["targets"]) for r in rows)
    context = StepContext("student", False, step_tokens, len(rows), len(micro_batches),
                          staleness=0 if not reused or window_start else 1)
    total = 0.0
    for mb in micro_batches:
        index = torch.cat([torch.full((len(r["targets"]),), i) for i, r in enumerate(mb)])
        tokens = StudentTokens(torch.cat([r["hidden"] for r in mb]).float(), LogitHead(head.float(), None),
                               torch.cat([r["targets"] for r in mb]), index,
                               torch.cat([r["old"] for r in mb]).float(),
                               torch.tensor([r["advantage"] for r in mb], dtype=torch.float32)[index])
        loss, _ = group_policy_loss(tokens, context, settings)
        total = total + loss.loss_sum / step_tokens
    return total


@pytest.mark.parametrize("reused", [False, True])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_each_loss_type_matches_its_definition_values_and_gradients(loss_type, reused):
    rows, head, micro_batches = step_rows()
    clip = ClipSettings(0.2, 0.28, dual_clip=None)
    for row in rows:
        row["hidden"].requires_grad_(True)
    expected = naive_loss(rows, head, loss_type, micro_batches, reused, clip)
    expected_grads = torch.autograd.grad(expected, [r["hidden"] for r in rows])
    leaves = [r["hidden"].detach().float().requires_grad_(True) for r in rows]
    float_rows = [dict(r, hidden=leaf) for r, leaf in zip(rows, leaves)]
    actual = chunked_loss(float_rows, head, loss_type, [float_rows[:3], float_rows[3:]], reused, clip)
    actual.backward()
    torch.testing.assert_close(actual.double(), expected, rtol=1e-5, atol=1e-6)
    for leaf, grad in zip(leaves, expected_grads):
        torch.testing.assert_close(leaf.grad.double(), grad, rtol=1e-4, atol=1e-6)
    assert any(leaf.grad.abs().sum() > 0 for leaf in leaves)
    if reused:  # both clip bounds engage on this data, with positive and negative advantages
        ratios = torch.cat([(torch.log_softmax(r["hidden"].detach() @ head.T, -1).gather(1, r["targets"].unsqueeze(1)).squeeze(1)
                             - r["old"]).exp() for r in rows])
        assert (ratios > 1 + clip.epsilon_high).any() and (ratios < 1 - clip.epsilon_low).any()
        assert min(r["advantage"] for r in rows) < 0 < max(r["advantage"] for r in rows)


def test_grpo_dr_grpo_and_dapo_do_not_depend_on_the_micro_batch_split_but_bnpo_does():
    rows, head, _ = step_rows(seed=3)
    clip = ClipSettings(dual_clip=None)
    for loss_type in LOSS_TYPES:
        two = chunked_loss(rows, head, loss_type, [rows[:3], rows[3:]], False, clip)
        other = chunked_loss(rows, head, loss_type, [rows[:1], rows[1:]], False, clip)
        if loss_type == "bnpo":
            assert not torch.isclose(two, other, rtol=1e-4)
        else:
            torch.testing.assert_close(two, other, rtol=1e-5, atol=1e-7)


def test_a_fresh_rollout_has_ratio_one_and_no_clip_whatever_the_recorded_log_probs():
    rows, head, micro_batches = step_rows(seed=5)
    for row in rows:
        row["old"] = row["old"] + 5.0  # far off: a reused rollout would clip every token
    fresh = chunked_loss(rows, head, "dapo", micro_batches, False, ClipSettings(dual_clip=None))
    naive = naive_loss(rows, head, "dapo", micro_batches, False, ClipSettings(dual_clip=None))
    torch.testing.assert_close(fresh.double(), naive, rtol=1e-5, atol=1e-6)
    # ratio 1: the value is -sum A over tokens / tokens
    expected = -sum(r["advantage"] * len(r["targets"]) for r in rows) / sum(len(r["targets"]) for r in rows)
    assert float(fresh) == pytest.approx(expected, rel=1e-5)


def test_the_first_step_of_a_reuse_window_has_ratio_one_whatever_the_precision_of_the_recorded_log_probs():
    """num_iterations > 1: the rollout's first step trains the policy that sampled it. Log-probs recorded at
    generation in another precision (simulated: off by up to 0.3 nats) must not make a ratio or a clip there;
    the step equals a num_iterations 1 step exactly. On a later step of the window they are pi_old."""
    rows, head, _ = step_rows(seed=7)
    generator = torch.Generator().manual_seed(3)
    for row in rows:
        row["old"] = row["old"] + 0.3 * (2 * torch.rand(row["old"].shape, generator=generator, dtype=torch.float64) - 1)
    clip = ClipSettings(0.02, 0.02, dual_clip=None)  # tight: any precision noise in the ratio would clip

    def loss_and_grads(reused: bool, window_start: bool):
        leaves = [r["hidden"].detach().float().requires_grad_(True) for r in rows]
        float_rows = [dict(r, hidden=leaf) for r, leaf in zip(rows, leaves)]
        loss = chunked_loss(float_rows, head, "dapo", [float_rows[:3], float_rows[3:]], reused, clip, window_start)
        return loss, torch.autograd.grad(loss, leaves)

    plain, plain_grads = loss_and_grads(False, False)
    first, first_grads = loss_and_grads(True, True)
    later, _ = loss_and_grads(True, False)
    assert torch.equal(first, plain) and all(torch.equal(a, b) for a, b in zip(first_grads, plain_grads))
    assert not torch.isclose(later, plain, rtol=1e-4)
