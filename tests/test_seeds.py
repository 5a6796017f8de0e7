"""The seed streams (`distill.seeds`): each named formula gives exactly the value of the arithmetic it replaced, for
the inputs runs use (every number of a run made before depends on it), and the per-row seeds are stable."""

from __future__ import annotations

import pytest

from distill import seeds
from distill.generation import seeds as generation_seeds

SEEDS = (0, 1, 42, 1234, 2**31 - 1, 2**32 + 5)
INDICES = (0, 1, 2, 7, 63, 1000)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("index", INDICES)
def test_each_stream_is_the_formula_it_replaced(seed, index):
    assert seeds.process_seed(seed, index) == (seed + 1_000_003 * index) % 2**32  # training/state.py, set_seed
    assert seeds.epoch_order_seed(seed, index) == seed + 7919 * index  # data.py, StepSampler's epoch order
    assert seeds.source_draw_seed(seed, index) == seed * 1_000_003 + index  # methods/mixing.py, draw_sources
    assert seeds.cache_shard_seed(seed, index) == seed * 1_000_003 + index  # commands/cache_teacher.py, a shard
    for process in (0, 1, 3):
        assert seeds.teacher_window_seed(seed, index, process) == seed * 1_000_003 + index + 104_729 * (process + 1)
    for value in (seeds.process_seed(seed, index), seeds.epoch_order_seed(seed, index),
                  seeds.source_draw_seed(seed, index), seeds.cache_shard_seed(seed, index)):
        assert type(value) is int


def test_pinned_values():
    assert seeds.process_seed(42, 0) == 42 and seeds.process_seed(42, 3) == 3_000_051
    assert seeds.process_seed(2**32 - 1, 1) == 1_000_002
    assert seeds.epoch_order_seed(42, 2) == 15_880
    assert seeds.source_draw_seed(42, 5) == 42_000_131
    assert seeds.cache_shard_seed(7, 3) == 7_000_024
    assert seeds.teacher_window_seed(42, 10, 1) == 42_209_594


def test_row_seeds_are_stable_and_the_generation_name_is_the_same_function():
    assert seeds.row_seed(42, "student", 0, 0) == 4546996702477863279  # the value the run's first student row drew
    assert seeds.row_seeds(2, 7, "cache", 3) == [7181640852510794010, 3808975892761384912]
    assert seeds.row_seeds(3, 42, "student", 0) == [seeds.row_seed(42, "student", 0, row) for row in range(3)]
    assert all(0 <= s < 2**seeds.SEED_BITS for s in seeds.row_seeds(100, 42, "x"))
    assert len(set(seeds.row_seeds(100, 42, "x"))) == 100
    assert generation_seeds.row_seeds is seeds.row_seeds and generation_seeds.row_seed is seeds.row_seed
    assert generation_seeds.teacher_window_seed is seeds.teacher_window_seed
