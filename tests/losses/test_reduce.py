"""The token-weighted reduction training logs with (MetricWindow): sum of numerators / sum of counts over processes."""

import pytest
import torch

from distill.training.metrics import MetricWindow
from tests.distributed import run_in_processes


def _values_and_masks():
    """Two ranks with very different numbers of valid tokens (3 vs 40) and different typical values."""
    g = torch.Generator().manual_seed(40)
    values = [torch.randn(4, 16, generator=g) + 5.0, torch.randn(4, 16, generator=g) - 1.0]
    masks = [torch.zeros(4, 16, dtype=torch.bool), torch.zeros(4, 16, dtype=torch.bool)]
    masks[0][0, :3] = True
    masks[1][:, :10] = True
    return values, masks


def _rank_window(rank, world_size, dtype):
    """What the trainer does per micro-batch: add a (float64 sum of the valid values, their count) pair."""
    values, masks = _values_and_masks()
    window = MetricWindow()
    window.register(["kl", "never_seen_here"], ["micro_batches"], ["length_max"])
    for half in (slice(0, 2), slice(2, 4)):  # two micro-batches on each process
        v, m = values[rank][half].to(dtype), masks[rank][half]
        window.add_mean("kl", float(v.double()[m].sum()), int(m.sum()))
        window.add_sum("micro_batches", 1)
        window.add_max("length_max", float(m.sum(dim=1).max()))
    return window.reduce()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_in_two_processes_is_the_token_mean(dtype):
    values, masks = _values_and_masks()
    expected = torch.cat([v.to(dtype).double()[m] for v, m in zip(values, masks)]).mean().item()
    per_rank_means = [v[m].mean().item() for v, m in zip(values, masks)]
    results = run_in_processes(_rank_window, world_size=2, args=(dtype,))
    assert results[0] == results[1]
    assert results[0]["kl"] == pytest.approx(expected, rel=1e-12)
    assert results[0]["micro_batches"] == 4.0 and results[0]["length_max"] == 10.0
    assert "never_seen_here" not in results[0]  # a registered mean with no count anywhere is not logged
    # The biased mean of per-rank means is far from it: the test can tell the two apart.
    assert abs(sum(per_rank_means) / 2 - expected) > 1.0


def test_single_process_window():
    window = MetricWindow()
    window.add_mean("loss", 6.0, 4)
    window.add_mean("loss", 4.0, 1)
    window.add_mean("empty", 0.0, 0)
    assert window.reduce() == {"loss": 2.0}
