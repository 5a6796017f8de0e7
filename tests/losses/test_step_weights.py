"""SOD's step-wise weights (`distill.losses.step_weights`, `distill.objectives.step_weighting`) against a float64 twin
written from the paper's definition: each step's mean |log-prob gap|, then the running product of adjacent ratios
clipped at 1 + delta, step by step; the weighted generalized JSD's values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from distill.losses import LogitHead
from distill.losses.step_weights import step_divergence_weights
from distill.objectives import StepContext
from distill.objectives.base import StudentTokens
from distill.objectives.divergence import DivergenceObjective
from distill.objectives.staleness import StalenessCorrection
from distill.objectives.step_weighting import StepDivergenceWeighting
from distill.signals import DenseSignal, SparseSignal
from tests.losses import reference

# (row, model turn) of each trained token in row-major order: row 0 has three trained turns, row 1 one, row 2 two
# with a teacher's turn (1) between them, untrained and so absent; row 3 two turns of one token each.
STEPS = [(0, 0)] * 3 + [(0, 1)] * 4 + [(0, 2)] * 2 + [(1, 0)] * 5 + [(2, 0)] * 2 + [(2, 2)] * 3 + [(3, 0), (3, 1)]
VOCAB, HIDDEN, TEMPERATURE = 19, 8, 1.2


def naive_weights(gaps: list[float], epsilon: float, delta: float) -> list[float]:
    """The paper's Eq. 7 as its code computes it (`compute_stepwise_opd_weights`): steps in order, d_k their mean gap,
    w_1 = 1 and w_k = min(prod_{u<k} (d_u + eps) / (d_{u+1} + eps), 1 + delta), the product carried unclipped."""
    weights = []
    for row in sorted({r for r, _ in STEPS}):
        turns = sorted({t for r, t in STEPS if r == row})
        d = []
        for turn in turns:
            mine = [g for g, key in zip(gaps, STEPS) if key == (row, turn)]
            d.append(math.fsum(mine) / len(mine))
        w, product = [1.0], 1.0
        for u in range(len(d) - 1):
            product *= (d[u] + epsilon) / (d[u + 1] + epsilon)
            w.append(min(product, 1.0 + delta))
        by_turn = dict(zip(turns, w))
        weights += [by_turn[t] for r, t in STEPS if r == row]
    return weights


def rows_and_turns() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([r for r, _ in STEPS]), torch.tensor([t for _, t in STEPS])


@pytest.mark.parametrize("epsilon, delta", [(1e-6, 0.2), (0.05, 0.0), (1e-6, 10.0)])
def test_the_weights_are_the_papers_running_product_clipped_at_one_plus_delta(epsilon, delta):
    # each step's gaps around its own level: later steps both further from the teacher than the first and closer
    level = {(0, 0): 0.5, (0, 1): 1.5, (0, 2): 0.1, (1, 0): 0.3, (2, 0): 0.2, (2, 2): 0.9, (3, 0): 0.0, (3, 1): 0.4}
    noise = 0.1 * torch.rand(len(STEPS), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gaps = torch.tensor([level[key] for key in STEPS], dtype=torch.float64) + noise
    rows, turns = rows_and_turns()
    weights, divergence = step_divergence_weights(gaps.float(), rows, turns, epsilon, delta)
    want = naive_weights(gaps.float().double().tolist(), epsilon, delta)
    assert weights.dtype == torch.float32 and weights.tolist() == pytest.approx(want, rel=1e-6)
    assert any(w < 1.0 for w in want)  # a step further from the teacher than the first is weighed down
    assert any(w > 1.0 for w in want) == (delta > 0)  # a closer one up, by at most delta
    assert max(weights.tolist()) <= 1.0 + delta + 1e-6
    first = [k for k, key in enumerate(STEPS) if key == min(s for s in STEPS if s[0] == key[0])]
    assert all(weights[k].item() == 1.0 for k in first)  # w_1 = 1 exactly
    # each token carries its step's mean gap
    for k, key in enumerate(STEPS):
        mine = [g for g, s in zip(gaps.float().double().tolist(), STEPS) if s == key]
        assert divergence[k].item() == pytest.approx(sum(mine) / len(mine), rel=1e-6)


def test_a_step_further_from_the_teacher_than_the_first_is_weighed_down():
    rows, turns = torch.zeros(4, dtype=torch.long), torch.tensor([0, 0, 1, 1])
    weights, _ = step_divergence_weights(torch.tensor([0.1, 0.1, 0.4, 0.4]), rows, turns, 1e-6, 0.2)
    assert weights.tolist() == pytest.approx([1.0, 1.0, 0.25, 0.25], rel=1e-5)
    closer, _ = step_divergence_weights(torch.tensor([0.4, 0.4, 0.1, 0.1]), rows, turns, 1e-6, 0.2)
    assert closer.tolist() == pytest.approx([1.0, 1.0, 1.2, 1.2])  # 4x closer, capped at 1 + delta
    empty, _ = step_divergence_weights(torch.zeros(0), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                                       1e-6, 0.2)
    assert empty.shape == (0,)
    with pytest.raises(ValueError, match="shape"):
        step_divergence_weights(torch.zeros(3), rows, turns, 1e-6, 0.2)


def problem(seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    n = len(STEPS)
    return {"hidden": torch.randn(n, HIDDEN, generator=generator), "weight": torch.randn(VOCAB, HIDDEN, generator=generator),
            "teacher": torch.randn(n, HIDDEN, generator=generator),
            "teacher_weight": torch.randn(VOCAB, HIDDEN, generator=generator),
            "targets": torch.randint(0, VOCAB, (n,), generator=generator)}


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_weighted_divergence_and_its_gradient_match_the_float64_twin(beta):
    p = problem()
    rows, turns = rows_and_turns()
    hidden = p["hidden"].clone().requires_grad_(True)
    weight = p["weight"].clone().requires_grad_(True)
    tokens = StudentTokens(hidden, LogitHead(weight), p["targets"], rows, turns=turns)
    signal = DenseSignal(p["teacher"], LogitHead(p["teacher_weight"]))
    weighting = StepDivergenceWeighting(1e-6, 0.2)
    objective = DivergenceObjective(lambda source: beta, TEMPERATURE, 5, step_weighting=weighting)
    out = objective(tokens, signal, StepContext("student"))

    ref_hidden = p["hidden"].double().requires_grad_(True)
    ref_weight = p["weight"].double().requires_grad_(True)
    student = reference.probs(reference.head_logits(ref_hidden, ref_weight), TEMPERATURE)
    teacher = reference.probs(reference.head_logits(p["teacher"], p["teacher_weight"]), TEMPERATURE)
    pick = p["targets"][:, None]
    gaps = (torch.log(student.detach().gather(1, pick)) - torch.log(teacher.gather(1, pick))).abs().squeeze(1)
    weights = naive_weights(gaps.tolist(), 1e-6, 0.2)
    assert len(set(weights)) > 3  # the steps differ
    expected = (reference.jsd(student, teacher, beta) * torch.tensor(weights, dtype=torch.float64)).sum()
    torch.testing.assert_close(out.loss_sum.double(), expected, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(out.loss_sum, [hidden, weight])
    want = torch.autograd.grad(expected, [ref_hidden, ref_weight])  # the weights are constants: no path through them
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-6)
    numerator, denominator = out.metrics["step_divergence/weight"]
    assert float(numerator) / float(denominator) == pytest.approx(sum(weights) / len(weights), rel=1e-5)


def test_only_the_students_samples_are_weighed_and_a_stale_samples_weights_multiply():
    p = problem(1)
    rows, turns = rows_and_turns()
    tokens = StudentTokens(p["hidden"], LogitHead(p["weight"]), p["targets"], rows, turns=turns)
    signal = DenseSignal(p["teacher"], LogitHead(p["teacher_weight"]))
    plain = DivergenceObjective(lambda source: 0.5, TEMPERATURE, 5)
    weighted = DivergenceObjective(lambda source: 0.5, TEMPERATURE, 5, step_weighting=StepDivergenceWeighting())
    for source in ("teacher", "dataset"):
        assert torch.equal(weighted(tokens, signal, StepContext(source)).loss_sum,
                           plain(tokens, signal, StepContext(source)).loss_sum)
    assert not torch.equal(weighted(tokens, signal, StepContext("student")).loss_sum,
                           plain(tokens, signal, StepContext("student")).loss_sum)
    # stale student samples: the staleness weights times the step weights
    behaviour = torch.zeros(len(STEPS)) - 3.0
    stale_tokens = StudentTokens(p["hidden"], LogitHead(p["weight"]), p["targets"], rows, behaviour, turns=turns)
    correction = StalenessCorrection("tis", "token", 1.5)
    both = DivergenceObjective(lambda source: 0.5, TEMPERATURE, 5, staleness=correction,
                               step_weighting=StepDivergenceWeighting())
    out = both(stale_tokens, signal, StepContext("student", staleness=1))
    assert {"staleness/ratio", "step_divergence/weight", "step_divergence/gap"} <= set(out.metrics)
    step_weights, _ = StepDivergenceWeighting().weights(stale_tokens, signal, TEMPERATURE, 5)
    current = torch.log(reference.probs(reference.head_logits(p["hidden"], p["weight"]), TEMPERATURE))
    stale_weights, _, _ = correction.weights(current.gather(1, p["targets"][:, None]).squeeze(1).float() - behaviour, rows)
    from distill.objectives.divergence import LossSettings, divergence

    want = divergence(StudentTokens(p["hidden"], LogitHead(p["weight"]), p["targets"], rows,
                                    loss_weights=stale_weights * step_weights), signal, LossSettings(0.5, TEMPERATURE, 5))
    torch.testing.assert_close(out.loss_sum, want.loss_sum)


def test_a_teacher_that_gives_only_its_top_k_cannot_be_weighed_by_step():
    p = problem()
    rows, turns = rows_and_turns()
    tokens = StudentTokens(p["hidden"], LogitHead(p["weight"]), p["targets"], rows, turns=turns)
    n = len(STEPS)
    signal = SparseSignal(torch.zeros(n, 2, dtype=torch.long), torch.full((n, 2), -1.0), None, None, TEMPERATURE)
    objective = DivergenceObjective(lambda source: 0.5, TEMPERATURE, 5, step_weighting=StepDivergenceWeighting())
    with pytest.raises(ValueError, match="log-prob of every completion token"):
        objective(tokens, signal, StepContext("student"))
