"""chunked_generalized_jsd against the naive float64 reference: values, gradients, chunking, dtypes."""

import pytest
import torch

from distill.losses import (
    chunked_generalized_jsd,
    divergence_diagnostics,
    generalized_jsd_loss,
)
from distill.losses.chunked import LogitHead
from tests.losses import reference as ref

BETAS = [0.0, 0.25, 0.5, 1.0]
N, H_S, H_T, V = 13, 8, 12, 37


def make_inputs(seed, with_bias=False):
    g = torch.Generator().manual_seed(seed)
    inputs = {
        "student_hidden": torch.randn(N, H_S, generator=g).requires_grad_(),
        "student_lm_head": (torch.randn(V, H_S, generator=g) * 0.7).requires_grad_(),
        "teacher_hidden": torch.randn(N, H_T, generator=g),
        "teacher_lm_head": torch.randn(V, H_T, generator=g) * 0.7,
    }
    if with_bias:
        inputs["student_bias"] = torch.randn(V, generator=g).requires_grad_()
        inputs["teacher_bias"] = torch.randn(V, generator=g)
    mask = torch.rand(N, generator=g) > 0.3
    mask[0] = True
    return inputs, mask


def reference_sum(inputs, mask, beta, temperature, s_scale=1.0, s_softcap=None, t_scale=1.0, t_softcap=None):
    """Naive masked sum and its float64 gradients w.r.t. the student's differentiable inputs."""
    leaves = {k: v.detach().double().requires_grad_() for k, v in inputs.items() if v.requires_grad}
    student_side = {**inputs, **leaves}
    student = ref.head_logits(student_side["student_hidden"], student_side["student_lm_head"], student_side.get("student_bias"), s_scale, s_softcap)
    teacher = ref.head_logits(inputs["teacher_hidden"], inputs["teacher_lm_head"], inputs.get("teacher_bias"), t_scale, t_softcap)
    per_token = ref.jsd(ref.probs(student, temperature), ref.probs(teacher, temperature), beta)
    total = per_token[mask].sum() if mask is not None else per_token.sum()
    grads = torch.autograd.grad(total, list(leaves.values()))
    return total, dict(zip(leaves, grads))


def run(inputs, mask, **kwargs):
    out = chunked_generalized_jsd(**inputs, mask=mask, **kwargs)
    names = [k for k, v in inputs.items() if v.requires_grad]
    grads = torch.autograd.grad(out.loss_sum, [inputs[k] for k in names])
    return out, dict(zip(names, grads))


def assert_matches(out, grads, expected, expected_grads, rtol=1e-5):
    assert out.loss_sum.dtype == torch.float32
    ref.assert_close_relative(out.loss_sum, expected, rtol, "loss")
    for name, grad in grads.items():
        ref.assert_close_relative(grad, expected_grads[name], rtol, name)


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_naive_reference(beta, temperature, masked):
    inputs, mask = make_inputs(seed=10, with_bias=True)
    mask = mask if masked else None
    out, grads = run(inputs, mask, beta=beta, temperature=temperature, chunk_size=4)
    expected, expected_grads = reference_sum(inputs, mask, beta, temperature)
    assert_matches(out, grads, expected, expected_grads)
    assert out.num_tokens.item() == (N if mask is None else int(mask.sum()))


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_scaled_and_soft_capped_logits(beta):
    inputs, mask = make_inputs(seed=11, with_bias=True)
    kwargs = dict(student_logit_scale=1.7, student_softcap=3.0, teacher_logit_scale=0.8, teacher_softcap=5.0)
    out, grads = run(inputs, mask, beta=beta, temperature=0.7, chunk_size=5, **kwargs)
    expected, expected_grads = reference_sum(inputs, mask, beta, 0.7, 1.7, 3.0, 0.8, 5.0)
    assert_matches(out, grads, expected, expected_grads)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_chunk_size_does_not_change_the_result(beta):
    inputs, mask = make_inputs(seed=12, with_bias=True)
    results = [run(inputs, mask, beta=beta, chunk_size=c) for c in (1, 7, N, 1000)]
    base_out, base_grads = results[0]
    for out, grads in results[1:]:
        ref.assert_close_relative(out.loss_sum, base_out.loss_sum, 1e-5, "loss")
        for name in grads:
            ref.assert_close_relative(grads[name], base_grads[name], 1e-5, name)


@pytest.mark.parametrize("beta", BETAS)
def test_equals_the_dense_loss_in_float32(beta):
    inputs, mask = make_inputs(seed=13)
    out, grads = run(inputs, mask, beta=beta, temperature=0.7, chunk_size=3)
    hs, ws = (inputs[k].detach().requires_grad_() for k in ("student_hidden", "student_lm_head"))
    dense = generalized_jsd_loss(
        hs @ ws.T, inputs["teacher_hidden"] @ inputs["teacher_lm_head"].T, torch.where(mask, 0, -100), beta=beta, temperature=0.7, reduction="sum"
    )
    dense_grads = torch.autograd.grad(dense, [hs, ws])
    ref.assert_close_relative(out.loss_sum, dense, 1e-5, "loss")
    ref.assert_close_relative(grads["student_hidden"], dense_grads[0], 1e-5, "student_hidden")
    ref.assert_close_relative(grads["student_lm_head"], dense_grads[1], 1e-5, "student_lm_head")


def test_bfloat16_inputs():
    inputs, mask = make_inputs(seed=14, with_bias=True)
    low = {k: (v.detach().bfloat16().requires_grad_() if v.requires_grad else v.bfloat16()) for k, v in inputs.items()}
    out, grads = run(low, mask, beta=0.5, chunk_size=4)
    # The reference sees the same bf16-rounded numbers; the remaining gap is bf16 matmul rounding.
    expected, expected_grads = reference_sum({k: v.float().requires_grad_(v.requires_grad) for k, v in low.items()}, mask, 0.5, 1.0)
    assert out.loss_sum.dtype == torch.float32
    ref.assert_close_relative(out.loss_sum, expected, 2e-2, "loss")
    for name, grad in grads.items():
        assert grad.dtype == torch.bfloat16
        ref.assert_close_relative(grad, expected_grads[name], 3e-2, name)


def test_all_masked_gives_zero_and_finite_gradients():
    inputs, _ = make_inputs(seed=15, with_bias=True)
    out, grads = run(inputs, torch.zeros(N, dtype=torch.bool), beta=0.5, return_stats=True)
    assert out.loss_sum.item() == 0.0 and out.num_tokens.item() == 0
    for grad in grads.values():
        assert torch.isfinite(grad).all() and torch.equal(grad, torch.zeros_like(grad))
    assert torch.equal(out.stats.forward_kl, torch.zeros(N))


def test_frozen_student_weight_gets_no_gradient_and_hidden_still_does():
    inputs, mask = make_inputs(seed=16)
    inputs["student_lm_head"] = inputs["student_lm_head"].detach()
    out, grads = run(inputs, mask, beta=0.5)
    assert set(grads) == {"student_hidden"}
    _, expected_grads = reference_sum(inputs, mask, 0.5, 1.0)
    ref.assert_close_relative(grads["student_hidden"], expected_grads["student_hidden"], 1e-5, "student_hidden")


def test_statistics_match_the_dense_diagnostics():
    inputs, mask = make_inputs(seed=17)
    out = chunked_generalized_jsd(**inputs, mask=mask, beta=0.5, temperature=0.7, chunk_size=4, return_stats=True)
    dense = divergence_diagnostics(
        inputs["student_hidden"] @ inputs["student_lm_head"].T, inputs["teacher_hidden"] @ inputs["teacher_lm_head"].T, 0.7
    )
    for name, got, want in zip(dense._fields, out.stats, dense):
        torch.testing.assert_close(got, torch.where(mask, want, 0.0), rtol=1e-5, atol=1e-5, msg=name)
    ps = ref.probs(inputs["student_hidden"].detach() @ inputs["student_lm_head"].detach().T, 0.7)
    pt = ref.probs(inputs["teacher_hidden"] @ inputs["teacher_lm_head"].T, 0.7)
    torch.testing.assert_close(out.stats.forward_kl[mask].double(), ref.kl(pt, ps)[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.stats.reverse_kl[mask].double(), ref.kl(ps, pt)[mask], rtol=1e-5, atol=1e-6)


def test_backward_scales_with_the_incoming_gradient():
    inputs, mask = make_inputs(seed=18)
    out = chunked_generalized_jsd(**inputs, mask=mask, beta=0.5)
    (once,) = torch.autograd.grad(out.loss_sum, inputs["student_hidden"], retain_graph=True)
    (thrice,) = torch.autograd.grad(3.0 * out.loss_sum, inputs["student_hidden"])
    torch.testing.assert_close(thrice, 3.0 * once)


@pytest.mark.parametrize(
    "change, name",
    [
        ({"beta": 1.01}, "beta"),
        ({"temperature": -0.5}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"teacher_hidden": torch.randn(N - 1, H_T)}, "teacher_hidden"),
        ({"student_lm_head": torch.randn(V, H_S + 1)}, "student_lm_head"),
        ({"teacher_lm_head": torch.randn(V + 3, H_T)}, "cross-tokenizer"),
        ({"mask": torch.ones(N + 1, dtype=torch.bool)}, "mask"),
        ({"student_softcap": -1.0}, "softcap"),
    ],
)
def test_bad_arguments_name_the_argument(change, name):
    inputs, mask = make_inputs(seed=19)
    kwargs = {**inputs, "mask": mask, **change}
    with pytest.raises(ValueError, match=name):
        chunked_generalized_jsd(**kwargs)


def test_logit_head_full_logits_matches_reference():
    g = torch.Generator().manual_seed(20)
    head = LogitHead(torch.randn(V, H_S, generator=g), torch.randn(V, generator=g), scale=1.3, softcap=2.0)
    hidden = torch.randn(N, H_S, generator=g)
    ref.assert_close_relative(head.full_logits(hidden), ref.head_logits(hidden, head.weight, head.bias, 1.3, 2.0), 1e-6, "logits")
