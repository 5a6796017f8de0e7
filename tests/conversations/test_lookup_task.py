"""The bundled tool-use task: an invented registry that only its tool answers, held-out entries never trained on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from distill.data import examples_from_dataset
from distill.data_files import BUNDLED_SETS, load_dataset_spec
from distill.rendering import TextRenderer
from distill.tasks.lookup import REGISTRY, lookup_code

ROOT = Path(__file__).resolve().parents[2]


def test_the_tool_answers_the_registry_and_says_when_it_does_not_know():
    name, code = next(iter(REGISTRY.items()))
    assert lookup_code(name) == f"The code of {name} is {code}." and lookup_code(f" {name.lower()} ").endswith(f"{code}.")
    assert "no entry named 'Paris'" in lookup_code("Paris")
    assert len(REGISTRY) == 96 and all(len(c) == 4 for c in REGISTRY.values())


def test_the_rows_are_the_scripts_and_held_out_entries_are_never_trained_on(tmp_path, tokenizer):
    written = tmp_path / "lookup.jsonl"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_lookup.py"), str(written)], check=True, capture_output=True)
    assert written.read_text() == BUNDLED_SETS["bundled:lookup"].read_text()  # the bundled file is the script's output
    train = examples_from_dataset(load_dataset_spec("bundled:lookup", "train", "dataset"), "dataset")
    held_out = examples_from_dataset(load_dataset_spec("bundled:lookup", "heldout", "eval_dataset"), "eval_dataset")
    assert (len(train), len(held_out)) == (64, 32)
    assert not {e.row["entry"] for e in train} & {e.row["entry"] for e in held_out}
    example = train[0]
    assert example.turns is not None and example.answer in example.turns[-1]["content"]
    encoded = TextRenderer(tokenizer, 512, 512, [tokenizer.eos_token_id]).row(example)
    trained = tokenizer.decode([t for t, f in zip(encoded.completion_ids, encoded.completion_trained) if f])
    assert '"name": "lookup_code"' in trained and example.answer in trained
