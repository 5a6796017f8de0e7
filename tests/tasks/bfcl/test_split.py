"""Train and held-out rows share no function (rows that offer a common function stay together), the held-out share
is as asked where the groups allow, and the split depends only on the data and the seed."""

from __future__ import annotations

import json

import pytest

from distill.tasks.bfcl.rows import category_rows, installed_data_dir
from distill.tasks.bfcl.split import function_groups, offered_functions, split_by_function


def row(*names: str) -> dict:
    return {"id": "+".join(names), "bfcl": json.dumps({"functions": [{"name": name} for name in names]})}


def test_rows_that_offer_a_common_function_fall_in_one_group():
    rows = [row("a"), row("b", "c"), row("c", "d"), row("e"), row("d", "f"), row("a")]
    assert function_groups(rows) == [{"a"}, {"b", "c", "d", "f"}, {"e"}]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_function_is_offered_on_both_sides(seed):
    rows = [row(f"f{i}") for i in range(20)] + [row("g1", "g2"), row("g2", "g3")] + [row("f3"), row("f3")]
    split = split_by_function(rows, 0.25, seed)
    train = {name for r in split.train for name in offered_functions(r)}
    heldout = {name for r in split.heldout for name in offered_functions(r)}
    assert not train & heldout and train | heldout == {n for r in rows for n in offered_functions(r)}
    assert sorted(train) == split.train_functions and sorted(heldout) == split.heldout_functions
    assert len(split.heldout) == 6 and len(split.train) + len(split.heldout) == len(rows)  # round(0.25 * 24)


def test_the_real_split_is_disjoint_sized_and_a_function_of_the_seed_alone():
    data = installed_data_dir()
    rows = category_rows(data, "simple_python") + category_rows(data, "multiple")
    split = split_by_function(rows, 0.25, seed=0)
    assert not {n for r in split.train for n in offered_functions(r)} & {n for r in split.heldout for n in offered_functions(r)}
    assert len(split.heldout) == 150 and len(split.train) == 450
    again = split_by_function(list(rows), 0.25, seed=0)
    assert [r["id"] for r in again.heldout] == [r["id"] for r in split.heldout]
    other = split_by_function(rows, 0.25, seed=1)
    assert {r["id"] for r in other.heldout} != {r["id"] for r in split.heldout}
    # the functions the held-out rows must call appear in no training row's prompt
    called = {next(iter(call)) for r in split.heldout for call in json.loads(r["bfcl"])["answer"]}
    assert not called & set(split.train_functions)


def test_a_fraction_outside_zero_to_one_is_refused():
    with pytest.raises(ValueError, match="heldout_fraction must be between 0 and 1"):
        split_by_function([row("a")], 1.0, 0)
