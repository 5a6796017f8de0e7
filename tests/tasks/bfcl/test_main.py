"""`python -m distill.tasks.bfcl`: the rows and the split's record written, the same on every run, and read back by
distill's dataset loader as the train and held-out splits."""

from __future__ import annotations

import json
import subprocess
import sys

from distill.data import examples_from_dataset
from distill.data_files import load_dataset_spec
from distill.tasks.bfcl.__main__ import main


def test_the_command_writes_both_splits_and_the_function_lists(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "a"), "--multi-turn", "multi_turn_base"]) == 0
    assert "450 train rows" in capsys.readouterr().out
    record = json.loads((tmp_path / "a" / "split.json").read_text())
    assert record["rows"] == {"train": 450, "heldout": 150} and record["categories"] == ["simple_python", "multiple"]
    assert not set(record["train_functions"]) & set(record["heldout_functions"])
    assert len(record["multi_turn"]["heldout_ids"]) == 50
    for split, count in (("train", 450), ("heldout", 150)):
        examples = examples_from_dataset(load_dataset_spec(str(tmp_path / "a" / "bfcl.jsonl"), split, "dataset"), "dataset")
        assert len(examples) == count and all(e.tools and e.turns for e in examples)
    multi_turn = examples_from_dataset(load_dataset_spec(str(tmp_path / "a" / "multi_turn_base.jsonl"), "heldout", "x"), "x")
    assert sorted(e.row["id"] for e in multi_turn) == record["multi_turn"]["heldout_ids"]
    subprocess.run([sys.executable, "-m", "distill.tasks.bfcl", "--out", str(tmp_path / "b"), "--multi-turn",
                    "multi_turn_base"], check=True, capture_output=True)
    for name in ("bfcl.jsonl", "split.json", "multi_turn_base.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_folder_without_bfcl_data_is_one_line_naming_the_file(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "out"), "--data", str(tmp_path)]) == 2
    assert "BFCL_v4_simple_python.json does not exist" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
