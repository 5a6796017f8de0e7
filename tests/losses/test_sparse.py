"""sparse_generalized_jsd against the naive coarsened reference, the dense loss at k = V, and its bound."""

import pytest
import torch

from distill.losses import generalized_jsd_loss, sparse_generalized_jsd
from tests.losses import reference as ref

BETAS = [0.0, 0.25, 0.5, 1.0]
N, H, V = 11, 8, 29


def make_case(seed, k=5, temperature=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g).requires_grad_()
    weight = (torch.randn(V, H, generator=g) * 0.8).requires_grad_()
    teacher_logits = torch.randn(N, V, generator=g) * 2.0
    teacher_lp = torch.log_softmax(teacher_logits / temperature, dim=-1)
    topk = teacher_lp.topk(k, dim=-1)
    sampled = torch.randint(0, V, (N,), generator=g)
    sampled[:3] = topk.indices[:3, -1]  # some sampled tokens already in the top-k, some not
    mask = torch.rand(N, generator=g) > 0.25
    mask[0] = True
    return {
        "hidden": hidden,
        "weight": weight,
        "teacher_logits": teacher_logits,
        "ids": topk.indices,
        "lps": topk.values,
        "sampled": sampled,
        "sampled_lps": teacher_lp.gather(1, sampled[:, None]).squeeze(1),
        "mask": mask,
    }


def run(case, use_sampled=True, **kwargs):
    extra = {"sampled_ids": case["sampled"], "teacher_sampled_log_probs": case["sampled_lps"]} if use_sampled else {}
    out = sparse_generalized_jsd(case["hidden"], case["weight"], case["ids"], case["lps"], case["mask"], **extra, **kwargs)
    grads = torch.autograd.grad(out.loss_sum, [case["hidden"], case["weight"]])
    return out, grads


def reference(case, beta, temperature, tail, use_sampled=True, mask=None):
    mask = case["mask"] if mask is None else mask
    hidden = case["hidden"].detach().double().requires_grad_()
    weight = case["weight"].detach().double().requires_grad_()
    ps = ref.probs(ref.head_logits(hidden, weight), temperature)
    pt = ref.probs(case["teacher_logits"], temperature)
    cells = ref.sparse_cells(case["ids"], case["sampled"] if use_sampled else None)
    coarse_s, coarse_t = ref.coarsen(ps, cells, tail), ref.coarsen(pt, cells, tail)
    per_token = torch.stack([ref.jsd(s, t, beta) for s, t in zip(coarse_s, coarse_t)])
    total = per_token[mask].sum()
    return total, torch.autograd.grad(total, [hidden, weight]), per_token.detach()


def assert_matches(out, grads, expected, expected_grads, rtol=1e-5):
    ref.assert_close_relative(out.loss_sum, expected, rtol, "loss")
    ref.assert_close_relative(grads[0], expected_grads[0], rtol, "hidden")
    ref.assert_close_relative(grads[1], expected_grads[1], rtol, "weight")


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tail", [True, False])
def test_matches_naive_coarsened_reference(beta, temperature, tail):
    case = make_case(seed=30, temperature=temperature)
    out, grads = run(case, beta=beta, temperature=temperature, tail=tail, chunk_size=4)
    expected, expected_grads, _ = reference(case, beta, temperature, tail)
    assert_matches(out, grads, expected, expected_grads)
    assert out.num_tokens.item() == int(case["mask"].sum())


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_without_sampled_tokens_and_without_mask(beta):
    case = make_case(seed=31, k=3)
    case["mask"] = torch.ones(N, dtype=torch.bool)
    out, grads = run(case, use_sampled=False, beta=beta, chunk_size=5)
    expected, expected_grads, _ = reference(case, beta, 1.0, tail=True, use_sampled=False)
    assert_matches(out, grads, expected, expected_grads)


@pytest.mark.parametrize("beta", BETAS)
def test_k_equal_to_vocabulary_is_the_dense_loss(beta):
    case = make_case(seed=32, k=V, temperature=0.7)
    sparse, sparse_grads = run(case, beta=beta, temperature=0.7, chunk_size=4)
    hidden, weight = (case[k].detach().requires_grad_() for k in ("hidden", "weight"))
    labels = torch.where(case["mask"], 0, -100)
    dense = generalized_jsd_loss(hidden @ weight.T, case["teacher_logits"], labels, beta=beta, temperature=0.7, reduction="sum")
    dense_grads = torch.autograd.grad(dense, [hidden, weight])
    assert_matches(sparse, sparse_grads, dense, dense_grads)
    full_total, full_grads = _full_divergence(case, beta, 0.7)
    assert_matches(sparse, sparse_grads, full_total, full_grads)


def _full_divergence(case, beta, temperature, mask=None):
    mask = case["mask"] if mask is None else mask
    hidden = case["hidden"].detach().double().requires_grad_()
    weight = case["weight"].detach().double().requires_grad_()
    per_token = ref.jsd(ref.probs(ref.head_logits(hidden, weight), temperature), ref.probs(case["teacher_logits"], temperature), beta)
    total = per_token[mask].sum()
    return total, torch.autograd.grad(total, [hidden, weight])


@pytest.mark.parametrize("beta", BETAS)
@pytest.mark.parametrize("k", [1, 4, 12])
def test_tail_form_never_exceeds_the_full_divergence(beta, k):
    for seed in range(5):
        case = make_case(seed=100 + seed, k=k)
        out = sparse_generalized_jsd(
            case["hidden"], case["weight"], case["ids"], case["lps"], case["mask"],
            sampled_ids=case["sampled"], teacher_sampled_log_probs=case["sampled_lps"], beta=beta,
        )
        _, _, coarse_per_token = reference(case, beta, 1.0, tail=True)
        full_per_token = ref.jsd(ref.probs(case["hidden"].detach() @ case["weight"].detach().T), ref.probs(case["teacher_logits"]), beta)
        assert (coarse_per_token <= full_per_token + 1e-12).all()
        assert out.loss_sum.item() <= full_per_token[case["mask"]].sum().item() * (1 + 1e-5)


def test_chunk_size_does_not_change_the_result():
    case = make_case(seed=33)
    base, base_grads = run(case, beta=0.5, chunk_size=1)
    for chunk in (7, N):
        out, grads = run(case, beta=0.5, chunk_size=chunk)
        ref.assert_close_relative(out.loss_sum, base.loss_sum, 1e-5, "loss")
        for got, want in zip(grads, base_grads):
            ref.assert_close_relative(got, want, 1e-5, "grad")


def test_an_exact_teacher_tail_gives_the_same_result_as_the_implicit_one():
    case = make_case(seed=34)
    pt = ref.probs(case["teacher_logits"])
    covered = torch.zeros(N, V, dtype=torch.bool).scatter_(1, case["ids"], True).scatter_(1, case["sampled"][:, None], True)
    tail_lp = torch.log(pt.masked_fill(covered, 0).sum(1)).float()
    implicit, _ = run(case, beta=0.5)
    explicit, _ = run(case, beta=0.5, teacher_tail_log_probs=tail_lp)
    ref.assert_close_relative(explicit.loss_sum, implicit.loss_sum, 1e-5, "loss")


def test_all_masked_gives_zero_and_finite_gradients():
    case = make_case(seed=35)
    case["mask"] = torch.zeros(N, dtype=torch.bool)
    out, grads = run(case, beta=0.5)
    assert out.loss_sum.item() == 0.0
    for grad in grads:
        assert torch.isfinite(grad).all() and torch.equal(grad, torch.zeros_like(grad))


def test_statistics():
    case = make_case(seed=36)
    out = sparse_generalized_jsd(case["hidden"], case["weight"], case["ids"], case["lps"], case["mask"], beta=0.5, return_stats=True, overlap_k=3)
    mask = case["mask"]
    student_logits = case["hidden"].detach() @ case["weight"].detach().T
    ps = ref.probs(student_logits)
    cells = ref.sparse_cells(case["ids"], None)
    coarse_s, coarse_t = ref.coarsen(ps, cells, True), ref.coarsen(ref.probs(case["teacher_logits"]), cells, True)
    forward = torch.stack([ref.kl(t, s) for s, t in zip(coarse_s, coarse_t)])
    entropy = -(ps * ps.log()).sum(1)
    torch.testing.assert_close(out.stats.forward_kl[mask].double(), forward[mask], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.stats.student_entropy[mask].double(), entropy[mask], rtol=1e-5, atol=2e-5)
    top1 = (student_logits.argmax(1) == case["ids"][:, 0]).float()
    assert torch.equal(out.stats.top1_agreement, torch.where(mask, top1, 0.0))
    assert torch.equal(out.stats.reverse_kl[~mask], torch.zeros(int((~mask).sum())))


@pytest.mark.parametrize(
    "change, name",
    [
        ({"ids": torch.full((N, 5), V)}, "teacher_topk_ids"),
        ({"ids": torch.zeros(N, 5)}, "teacher_topk_ids"),
        ({"lps": torch.zeros(N, 4)}, "teacher_topk_log_probs"),
        ({"sampled": torch.full((N,), -1)}, "sampled_ids"),
    ],
)
def test_bad_inputs_name_the_argument(change, name):
    case = {**make_case(seed=37), **change}
    with pytest.raises(ValueError, match=name):
        run(case, beta=0.5)


def test_sampled_ids_need_their_log_probs_and_tail_needs_tail():
    case = make_case(seed=38)
    with pytest.raises(ValueError, match="teacher_sampled_log_probs"):
        sparse_generalized_jsd(case["hidden"], case["weight"], case["ids"], case["lps"], sampled_ids=case["sampled"])
    with pytest.raises(ValueError, match="tail"):
        sparse_generalized_jsd(case["hidden"], case["weight"], case["ids"], case["lps"], tail=False, teacher_tail_log_probs=case["lps"][:, 0])


def test_zero_mass_teacher_cell_where_the_student_has_no_mass_is_finite():
    from distill.losses import coarse_generalized_jsd

    student_lp = torch.tensor([[0.0, -200.0, -300.0]], dtype=torch.float32).requires_grad_()  # exp(-200) underflows
    teacher_lp = torch.tensor([[0.0, float("-inf"), -1.0]])
    valid = torch.tensor([[True, True, False]])
    for beta in (0.0, 0.5, 1.0):
        loss = coarse_generalized_jsd(student_lp, teacher_lp, valid, beta)
        (grad,) = torch.autograd.grad(loss.sum(), student_lp)
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all(), beta
