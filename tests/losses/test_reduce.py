"""Reductions: token-weighted across processes, float32 whatever the input dtype."""

import pytest
import torch

from distill.losses import global_masked_mean, masked_sum
from tests.distributed import run_in_processes


def _values_and_masks():
    """Two ranks with very different numbers of valid tokens (3 vs 40) and different typical values."""
    g = torch.Generator().manual_seed(40)
    values = [torch.randn(4, 16, generator=g) + 5.0, torch.randn(4, 16, generator=g) - 1.0]
    masks = [torch.zeros(4, 16, dtype=torch.bool), torch.zeros(4, 16, dtype=torch.bool)]
    masks[0][0, :3] = True
    masks[1][:, :10] = True
    return values, masks


def _rank_mean(rank, world_size, dtype):
    values, masks = _values_and_masks()
    return global_masked_mean(values[rank].to(dtype), masks[rank]).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_global_masked_mean_in_two_processes_is_the_token_mean(dtype):
    values, masks = _values_and_masks()
    expected = torch.cat([v.to(dtype).float()[m] for v, m in zip(values, masks)]).double().mean().item()
    per_rank_means = [v[m].mean().item() for v, m in zip(values, masks)]
    results = run_in_processes(_rank_mean, world_size=2, args=(dtype,))
    assert results[0] == results[1]
    assert results[0] == pytest.approx(expected, rel=1e-6)
    # The biased mean of per-rank means is far from it: the test can tell the two apart.
    assert abs(sum(per_rank_means) / 2 - expected) > 1.0


def test_single_process_mean_and_empty_mask():
    values, masks = _values_and_masks()
    assert global_masked_mean(values[1], masks[1]).item() == pytest.approx(values[1][masks[1]].mean().item(), rel=1e-6)
    assert global_masked_mean(values[0], torch.zeros_like(masks[0])).item() == 0.0
    assert global_masked_mean(torch.ones(3)).item() == 1.0


def test_masked_sum_is_float32_for_low_precision_values():
    values = torch.full((1000,), 1.001, dtype=torch.bfloat16)
    total = masked_sum(values, torch.ones(1000, dtype=torch.bool))
    assert total.dtype == torch.float32
    assert total.item() == pytest.approx(1000 * values[0].float().item(), rel=1e-6)
    with pytest.raises(ValueError, match="mask"):
        masked_sum(values, torch.ones(999, dtype=torch.bool))
