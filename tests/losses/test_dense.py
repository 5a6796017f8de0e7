"""generalized_jsd_loss: the definition, the reference library's values, dtypes and argument errors."""

import pytest
import torch

from distill.losses import generalized_jsd_loss
from tests.losses import reference as ref
from tests.skip_guard import needs_extra

BETAS = [0.0, 0.25, 0.5, 1.0]


def make_logits(seed, shape=(3, 5, 11), scale=3.0):
    g = torch.Generator().manual_seed(seed)
    student = (torch.randn(shape, generator=g) * scale).requires_grad_()
    teacher = torch.randn(shape, generator=g) * scale
    labels = torch.randint(0, shape[-1], shape[:-1], generator=g)
    labels[0, :2] = -100
    labels[2, 3:] = -100
    return student, teacher, labels


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_naive_reference_values_and_gradients(beta, temperature, masked):
    student, teacher, labels = make_logits(seed=1)
    loss = generalized_jsd_loss(student, teacher, labels if masked else None, beta=beta, temperature=temperature)
    (grad,) = torch.autograd.grad(loss, student)

    student64 = student.detach().double().requires_grad_()
    per_token = ref.jsd(ref.probs(student64, temperature), ref.probs(teacher, temperature), beta)
    if masked:
        keep = labels != -100
        expected = per_token[keep].sum() / keep.sum()
    else:
        expected = per_token.sum() / student.shape[0]
    (expected_grad,) = torch.autograd.grad(expected, student64)

    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad.double(), expected_grad, rtol=1e-4, atol=1e-7)


def test_ends_are_exactly_forward_and_reverse_kl():
    student, teacher, _ = make_logits(seed=2)
    forward = generalized_jsd_loss(student, teacher, beta=0.0, reduction="none").sum(-1)
    reverse = generalized_jsd_loss(student, teacher, beta=1.0, reduction="none").sum(-1)
    ps, pt = ref.probs(student.detach()), ref.probs(teacher)
    torch.testing.assert_close(forward.double(), ref.kl(pt, ps), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(reverse.double(), ref.kl(ps, pt), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(forward, reverse)


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("reduction", ["batchmean", "sum", "mean", "none"])
@pytest.mark.parametrize("masked", [False, True])
def test_same_values_as_the_reference_library(beta, reduction, masked):
    trl_gkd = needs_extra("trl.experimental.gkd", "trl")
    student, teacher, labels = make_logits(seed=3)
    labels = labels if masked else None
    ours = generalized_jsd_loss(student, teacher, labels, beta=beta, temperature=0.7, reduction=reduction)
    theirs = trl_gkd.GKDTrainer.generalized_jsd_loss(student, teacher, labels, beta=beta, temperature=0.7, reduction=reduction)
    assert ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def test_num_items_in_batch_overrides_the_reduction_like_the_reference():
    student, teacher, labels = make_logits(seed=4)
    total = generalized_jsd_loss(student, teacher, labels, reduction="sum")
    scaled = generalized_jsd_loss(student, teacher, labels, num_items_in_batch=torch.tensor(37))
    torch.testing.assert_close(scaled, total / 37)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    student, teacher, labels = make_logits(seed=5)
    low_s, low_t = student.detach().to(dtype).requires_grad_(), teacher.to(dtype)
    beta = 0.1  # 0.1 in bf16 is 0.10009765625: beta must not be rounded
    loss = generalized_jsd_loss(low_s, low_t, labels, beta=beta)
    expected = generalized_jsd_loss(low_s.detach().float(), low_t.float(), labels, beta=beta)
    assert loss.dtype == torch.float32
    assert torch.equal(loss.detach(), expected)
    (grad,) = torch.autograd.grad(loss, low_s)
    assert grad.dtype == dtype and torch.isfinite(grad).all()


def test_all_masked_batch_gives_zero_with_finite_gradients():
    student, teacher, labels = make_logits(seed=6)
    loss = generalized_jsd_loss(student, teacher, torch.full_like(labels, -100), beta=0.5)
    (grad,) = torch.autograd.grad(loss, student)
    assert loss.item() == 0.0
    assert torch.isfinite(grad).all() and torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"beta": -0.1}, "beta"),
        ({"beta": 1.5}, "beta"),
        ({"beta": float("nan")}, "beta"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": 0.0}, "temperature"),
        ({"reduction": "avg"}, "reduction"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    student, teacher, labels = make_logits(seed=7)
    with pytest.raises(ValueError, match=name):
        generalized_jsd_loss(student, teacher, labels, **kwargs)


def test_shape_and_vocabulary_mismatches_are_clear():
    student, teacher, labels = make_logits(seed=8)
    with pytest.raises(ValueError, match="cross-tokenizer"):
        generalized_jsd_loss(student, teacher[..., :-1], labels)
    with pytest.raises(ValueError, match="same shape"):
        generalized_jsd_loss(student, teacher[:, :-1], labels)
    with pytest.raises(ValueError, match="labels"):
        generalized_jsd_loss(student, teacher, labels[:, :-1])
