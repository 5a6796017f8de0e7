"""The bundled task sets (`bundled:facts` for knowledge injection, `bundled:arithmetic` for RL) and answer checking (`distill.tasks.answers`)."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

from distill.data import examples_from_dataset
from distill.data_files import BUNDLED_SETS, load_dataset_spec
from distill.tasks.answers import contains_answer, normalise

REPO = Path(__file__).resolve().parents[2]


def test_the_facts_set_has_a_training_question_and_two_held_out_paraphrases_per_fact():
    train = examples_from_dataset(load_dataset_spec("bundled:facts", "train", "dataset"), "dataset")
    heldout = examples_from_dataset(load_dataset_spec("bundled:facts", "heldout", "dataset"), "dataset")
    assert len(train) >= 150 and len(heldout) == 2 * len(train)
    rows = load_dataset_spec("bundled:facts", "heldout", "dataset")
    per_fact = collections.Counter(rows["fact_id"])
    assert set(per_fact.values()) == {2}
    demonstrations = {e.privileged_context for e in train}
    for example in train + heldout:
        question = example.prompt[-1]["content"]
        assert example.privileged_context in demonstrations and example.answer in example.privileged_context
        assert not contains_answer(question, example.answer), question  # the question never gives the answer away
        assert example.completion == example.privileged_context  # sft trains on the demonstration itself
    assert len({e.prompt[-1]["content"] for e in train + heldout}) == len(train) + len(heldout)


def test_the_facts_file_is_what_its_script_writes(tmp_path):
    """scripts/make_facts.py is deterministic and the shipped file is its output."""
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_facts.py"), str(tmp_path / "facts.jsonl")], check=True,
                   capture_output=True)
    assert (tmp_path / "facts.jsonl").read_bytes() == BUNDLED_SETS["bundled:facts"].read_bytes()


def test_answers_are_found_as_whole_words_after_normalisation():
    assert contains_answer("The capital is Harralwick.", "harralwick")
    assert contains_answer("It opened in 1,734? No: in 1734!", "1734")
    assert not contains_answer("It opened in 17345.", "1734")
    assert contains_answer("founded by  Oltalis\nDunzorow", "Oltalis Dunzorow")
    assert not contains_answer("founded by Oltalis", "Oltalis Dunzorow")
    assert not contains_answer("anything", "  ")
    assert normalise("Capy-Bara!") == "capy bara"


def test_the_arithmetic_set_has_300_training_and_100_held_out_sums_with_their_answers():
    train = load_dataset_spec("bundled:arithmetic", "train", "dataset")
    heldout = load_dataset_spec("bundled:arithmetic", "heldout", "dataset")
    assert len(train) == 300 and len(heldout) == 100
    pairs = [(row["a"], row["b"]) for row in train] + [(row["a"], row["b"]) for row in heldout]
    assert len(set(pairs)) == 400 and all(2 <= a <= 21 and 2 <= b <= 21 for a, b in pairs)
    for row in list(train) + list(heldout):
        assert row["prompt"] == [{"role": "user", "content": f"What is {row['a']} + {row['b']}? Answer with the number only."}]
        assert row["answer"] == str(row["a"] + row["b"])
    examples = examples_from_dataset(heldout, "eval_dataset")
    assert contains_answer("The answer is 24.", "24") and examples[0].answer == heldout[0]["answer"]


def test_the_arithmetic_file_is_what_its_script_writes(tmp_path):
    subprocess.run([sys.executable, str(REPO / "scripts" / "make_arithmetic.py"), str(tmp_path / "a.jsonl")], check=True,
                   capture_output=True)
    assert (tmp_path / "a.jsonl").read_bytes() == BUNDLED_SETS["bundled:arithmetic"].read_bytes()
