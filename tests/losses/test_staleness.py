"""The correction of stale student samples (`distill.objectives.staleness`) against a float64 twin from the definition:
importance ratios of a deliberately stale policy, by prefix, sequence or token, truncated (TIS) or masked (IcePop),
weighting the generalized JSD of each token; values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from distill.losses import LogitHead
from distill.objectives import StepContext
from distill.objectives.base import StudentTokens
from distill.objectives.divergence import DivergenceObjective
from distill.objectives.staleness import StalenessCorrection, raw_ratios
from distill.signals import DenseSignal
from tests.losses import reference

LENGTHS = (4, 1, 6)  # three samples, contiguous in row-major order
VOCAB, HIDDEN, TEMPERATURE = 23, 8, 1.3


def stale_problem(seed: int = 0, drift: float = 0.3) -> dict:
    generator = torch.Generator().manual_seed(seed)
    n = sum(LENGTHS)
    weight = torch.randn(VOCAB, HIDDEN, generator=generator)
    return {"hidden": torch.randn(n, HIDDEN, generator=generator), "weight": weight,
            # the policy that sampled: the same student some optimizer steps ago
            "old_weight": weight + drift * torch.randn(VOCAB, HIDDEN, generator=generator),
            "teacher": torch.randn(n, HIDDEN, generator=generator), "teacher_weight": torch.randn(VOCAB, HIDDEN, generator=generator),
            "targets": torch.randint(0, VOCAB, (n,), generator=generator),
            "rows": torch.tensor([row for row, length in enumerate(LENGTHS) for _ in range(length)])}


def naive_weights(current: list[float], behaviour: list[float], level: str, correction: str, cap: float) -> list[float]:
    """Per token, from the definition: products of probability ratios over a sample's tokens, one token at a time."""
    weights, position = [], 0
    for length in LENGTHS:
        ratios = [math.exp(current[position + t]) / math.exp(behaviour[position + t]) for t in range(length)]
        for t in range(length):
            if level == "token":
                w = ratios[t]
            elif level == "prefix":
                w = math.prod(ratios[:t])
            else:
                w = math.prod(ratios)
            if correction == "tis":
                w = min(w, cap)
            elif correction == "icepop":
                w = w if 1 / cap <= w <= cap else 0.0
            else:
                w = 1.0
            weights.append(w)
        position += length
    return weights


@pytest.mark.parametrize("level", ["prefix", "sequence", "token"])
@pytest.mark.parametrize("correction", ["tis", "icepop"])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_stale_samples_weigh_each_tokens_jsd_by_the_definitions_ratio(level, correction, beta):
    p = stale_problem()
    cap = 1.5
    hidden = p["hidden"].clone().requires_grad_(True)
    weight = p["weight"].clone().requires_grad_(True)
    # pi_behaviour: the stale policy's log-prob of each sampled token, at the loss temperature, as recorded at sampling
    behaviour_logits = reference.head_logits(p["hidden"], p["old_weight"])
    behaviour = torch.log(reference.probs(behaviour_logits, TEMPERATURE)).gather(1, p["targets"][:, None]).squeeze(1)
    tokens = StudentTokens(hidden, LogitHead(weight), p["targets"], p["rows"], behaviour.float())
    signal = DenseSignal(p["teacher"], LogitHead(p["teacher_weight"]))
    objective = DivergenceObjective(lambda source: beta, TEMPERATURE, 5, staleness=StalenessCorrection(correction, level, cap))
    out = objective(tokens, signal, StepContext("student", staleness=2))

    ref_hidden = p["hidden"].double().requires_grad_(True)
    ref_weight = p["weight"].double().requires_grad_(True)
    student = reference.probs(reference.head_logits(ref_hidden, ref_weight), TEMPERATURE)
    teacher = reference.probs(reference.head_logits(p["teacher"], p["teacher_weight"]), TEMPERATURE)
    current = torch.log(student.detach()).gather(1, p["targets"][:, None]).squeeze(1)
    weights = naive_weights(current.tolist(), behaviour.tolist(), level, correction, cap)
    assert any(w != 1.0 for w in weights)  # the policy is stale enough for the correction to matter
    if correction == "tis":
        assert any(w == cap for w in weights)
    expected = (reference.jsd(student, teacher, beta) * torch.tensor(weights, dtype=torch.float64)).sum()
    torch.testing.assert_close(out.loss_sum.double(), expected, rtol=1e-5, atol=1e-6)
    got = torch.autograd.grad(out.loss_sum, [hidden, weight])
    want = torch.autograd.grad(expected, [ref_hidden, ref_weight])
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-4, atol=1e-6)
    # the logged ratio is the raw one (before the bound), its mean over tokens
    raw = naive_weights(current.tolist(), behaviour.tolist(), level, "tis", math.inf)  # tis at an infinite cap: the raw ratio
    numerator, denominator = out.metrics["staleness/ratio"]
    assert float(numerator) / float(denominator) == pytest.approx(sum(raw) / len(raw), rel=1e-5)
    changed, _ = out.metrics["staleness/corrected_fraction"]
    assert int(changed) == sum(abs(w - r) > 1e-9 for w, r in zip(weights, raw))
    assert float(out.extrema["staleness/ratio_max"]) == pytest.approx(max(raw), rel=1e-5)


def test_the_raw_ratio_by_level_is_the_product_of_probability_ratios():
    generator = torch.Generator().manual_seed(1)
    log_ratios = 0.4 * torch.randn(sum(LENGTHS), generator=generator, dtype=torch.float64)
    rows = stale_problem()["rows"]
    ratios = log_ratios.exp().tolist()
    for level in ("prefix", "sequence", "token"):
        want, position = [], 0
        for length in LENGTHS:
            mine = ratios[position:position + length]
            want += [{"token": mine[t], "prefix": math.prod(mine[:t]), "sequence": math.prod(mine)}[level] for t in range(length)]
            position += length
        assert raw_ratios(log_ratios, rows, level).tolist() == pytest.approx(want, rel=1e-12)


def test_a_fresh_micro_batch_and_a_teachers_samples_get_no_weights():
    p = stale_problem()
    tokens = StudentTokens(p["hidden"], LogitHead(p["weight"]), p["targets"], p["rows"], torch.zeros(sum(LENGTHS)))
    signal = DenseSignal(p["teacher"], LogitHead(p["teacher_weight"]))
    plain = DivergenceObjective(lambda source: 0.5, TEMPERATURE, 5)
    corrected = DivergenceObjective(lambda source: 0.5, TEMPERATURE, 5, staleness=StalenessCorrection())
    for context in (StepContext("student", staleness=0), StepContext("teacher", staleness=0)):
        assert torch.equal(corrected(tokens, signal, context).loss_sum, plain(tokens, signal, context).loss_sum)
    stale = corrected(tokens, signal, StepContext("student", staleness=1))
    assert not torch.equal(stale.loss_sum, plain(tokens, signal, StepContext("student")).loss_sum)
    assert set(stale.metrics) == {"staleness/ratio", "staleness/corrected_fraction"}


def test_correction_none_weighs_every_token_one_and_still_logs_the_ratio():
    p = stale_problem()
    log_ratios = 0.5 * torch.randn(sum(LENGTHS), generator=torch.Generator().manual_seed(3))
    weights, metrics, extrema = StalenessCorrection("none").weights(log_ratios, p["rows"])
    assert torch.equal(weights, torch.ones(sum(LENGTHS)))
    assert float(metrics["staleness/ratio"][0]) == pytest.approx(float(raw_ratios(log_ratios.double(), p["rows"], "prefix").sum()))
    assert float(extrema["staleness/ratio_max"]) > 1 > float(extrema["staleness/ratio_min"])


def test_a_ratio_past_floating_point_range_stays_finite_and_bounded():
    rows = torch.zeros(400, dtype=torch.long)  # one long sample whose policy moved a lot
    log_ratios = torch.full((400,), 3.0, dtype=torch.float64)
    weights, metrics, extrema = StalenessCorrection("tis", "prefix", 2.0).weights(log_ratios, rows)
    assert torch.isfinite(weights).all() and float(weights.max()) == 2.0
    assert math.isfinite(float(metrics["staleness/ratio"][0])) and math.isfinite(float(extrema["staleness/ratio_max"]))
