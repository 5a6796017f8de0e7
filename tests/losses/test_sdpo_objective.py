"""SDPO's objective (`distill.objectives.sdpo`): the distillation term is a mean over the step's distilled
tokens, as the SDPO reference normalises it, checked against a float64 twin built from the definition; and
it does not depend on how the step's tokens are split into micro-batches."""

from __future__ import annotations

import torch

from distill.losses import LogitHead
from distill.losses.policy_gradient import ClipSettings
from distill.objectives import StepContext, StudentTokens
from distill.objectives.group_policy import PolicySettings
from distill.objectives.sdpo import SDPOObjective, SDPOSettings
from distill.objectives.self_distillation import SelfDistillationSettings
from distill.signals import SelfSignal
from tests.losses import reference
from tests.losses.test_self_distillation import leaves, problem

# Rows of 4, 6, 3 and 6 tokens; only rows 1 and 3 (12 of 19 tokens) have a demonstration.
LENGTHS, DISTILLED_ROWS = [4, 6, 3, 6], [False, True, False, True]


def objective(weight: float) -> SDPOObjective:
    policy = PolicySettings("dapo", ClipSettings(dual_clip=None), 1.0, 4, 8)
    return SDPOObjective(SDPOSettings(weight, policy, SelfDistillationSettings("full_logits", 0.0, 1.0, 4)))


def step_loss(p, weight: float, splits: list[list[int]], distilled_rows: list[bool] = DISTILLED_ROWS):
    """The trainer's loss of one step whose rows are split into micro-batches `splits` (row indices), and the
    gradient w.r.t. the student's hidden states, lm_head weight and bias."""
    hidden, head_weight, bias = leaves(p)
    rows = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    distilled = torch.tensor(distilled_rows)[rows]
    advantages = torch.tensor([0.5, -1.0, 1.5, -0.25])[rows]
    sizes = {"step_tokens": len(rows), "step_rows": len(LENGTHS), "step_micro_batches": len(splits),
             "step_counts": {"distilled_tokens": int(distilled.sum())}}
    total = torch.zeros(())
    for split in splits:
        index = torch.cat([(rows == r).nonzero().squeeze(1) for r in split])
        local_rows = torch.repeat_interleave(torch.arange(len(split)), torch.tensor([LENGTHS[r] for r in split]))
        tokens = StudentTokens(hidden[index], LogitHead(head_weight, bias), p["targets"][index], local_rows,
                               advantages=advantages[index])
        signal = SelfSignal(p["teacher"][index], LogitHead(p["teacher_weight"]), distilled=distilled[index])
        total = total + objective(weight)(tokens, signal, StepContext("student", **sizes)).loss_sum
    loss = total / len(rows)  # the trainer divides every loss sum by the step's tokens
    return loss, torch.autograd.grad(loss, [hidden, head_weight, bias])


def naive_distillation(p) -> torch.Tensor:
    """Forward KL(teacher || student) per token in probability space, float64, averaged over distilled tokens."""
    rows = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    distilled = torch.tensor(DISTILLED_ROWS)[rows]
    hidden, weight, bias = leaves(p, torch.float64)
    student = reference.probs(reference.head_logits(hidden, weight, bias))
    teacher = reference.probs(reference.head_logits(p["teacher"].double(), p["teacher_weight"].double()))
    per_token = reference.kl(teacher, student)
    loss = per_token[distilled].sum() / distilled.sum()
    return loss, torch.autograd.grad(loss, [hidden, weight, bias])


def test_the_distillation_term_is_a_mean_over_distilled_tokens_values_and_gradients():
    p = problem(21)
    loss, grads = step_loss(p, 1.0, [[0, 1, 2, 3]])
    want, want_grads = naive_distillation(p)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    for got, expected in zip(grads, want_grads):
        torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-6)


def test_the_sdpo_loss_does_not_depend_on_the_micro_batch_split():
    """Distilled rows all in one micro-batch, spread over two, or the undistilled rows alone in one: the same
    loss and gradient, for pure SDPO and the blend (the denominator is the whole step's distilled tokens)."""
    p = problem(22)
    for weight in (1.0, 0.5):
        whole, whole_grads = step_loss(p, weight, [[0, 1, 2, 3]])
        for splits in ([[0, 2], [1, 3]], [[0, 1], [2, 3]], [[3], [0], [2, 1]]):
            loss, grads = step_loss(p, weight, splits)
            torch.testing.assert_close(loss, whole, rtol=1e-5, atol=1e-6)
            for got, expected in zip(grads, whole_grads):
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_a_step_without_distilled_rows_has_no_distillation_loss():
    loss, grads = step_loss(problem(23), 1.0, [[0, 1], [2, 3]], distilled_rows=[False] * 4)
    assert loss == 0 and all(torch.equal(g, torch.zeros_like(g)) for g in grads)
