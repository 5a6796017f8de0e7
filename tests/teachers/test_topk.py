"""The top-k extraction shared by serve-teacher and cache-teacher, against a float64 definition."""

from __future__ import annotations

import pytest
import torch

from distill.losses import LogitHead
from distill.teachers.topk import topk_log_probs
from tests.losses.reference import head_logits, probs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("softcap", [None, 3.0])
def test_topk_log_probs_match_the_definition(temperature, softcap):
    generator = torch.Generator().manual_seed(0)
    n, hidden_size, vocab, k = 37, 16, 50, 6
    hidden = torch.randn(n, hidden_size, generator=generator)
    weight = torch.randn(vocab, hidden_size, generator=generator)
    bias = torch.randn(vocab, generator=generator)
    targets = torch.randint(0, vocab, (n,), generator=generator)
    top = topk_log_probs(hidden, LogitHead(weight, bias, 1.3, softcap), targets, k, temperature, chunk_size=8)

    p = probs(head_logits(hidden, weight, bias, 1.3, softcap), temperature)
    expected = p.topk(k, dim=1)
    assert torch.equal(top.ids, expected.indices)
    torch.testing.assert_close(top.log_probs.double(), expected.values.log(), atol=1e-5, rtol=0)
    torch.testing.assert_close(top.target_log_probs.double(), p.gather(1, targets[:, None]).squeeze(1).log(), atol=1e-5, rtol=0)
    outside = p.clone()
    outside.scatter_(1, expected.indices, 0.0)
    outside.scatter_(1, targets[:, None], 0.0)
    torch.testing.assert_close(top.tail_log_probs.double(), outside.sum(1).log(), atol=1e-5, rtol=1e-5)


def test_no_mass_left_gives_minus_infinity_tail():
    hidden, weight = torch.randn(3, 4), torch.randn(5, 4)
    top = topk_log_probs(hidden, LogitHead(weight), torch.tensor([0, 1, 2]), 5, 1.0)
    assert torch.isneginf(top.tail_log_probs).all()
