"""The bundled two-call task: an entry's partner, then the partner's code; the splits share no entry and no answer,
the demonstrations' conversations are what the tools answer, and the student's rows hold only prompts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from distill.conversations.tools import load_tools
from distill.data import examples_from_dataset
from distill.data_files import BUNDLED_SETS, load_dataset_spec
from distill.tasks.chain import PARTNERS, REGISTRY, SPLIT_OF, SPLITS, code_of, partner_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_tools_answer_the_registry_and_say_when_they_do_not_know():
    name = sorted(REGISTRY)[0]
    partner = PARTNERS[name]
    assert partner_of(f" {name.lower()} ") == f"The partner of {name} is {partner}."
    assert code_of(partner) == f"The code of {partner} is {REGISTRY[partner]}."
    assert "no entry named 'Paris'" in partner_of("Paris") and "no entry named 'Paris'" in code_of("Paris")
    assert all(PARTNERS[n] != n and SPLIT_OF[PARTNERS[n]] == SPLIT_OF[n] for n in REGISTRY)  # partners stay in a split
    assert sorted(PARTNERS.values()) == sorted(REGISTRY)  # each entry some other entry's partner: one cycle per split
    schemas = {name: tool.schema for name, tool in load_tools(["distill.tasks.chain:partner_of",
                                                                "distill.tasks.chain:code_of"]).items()}
    assert set(schemas) == {"partner_of", "code_of"}
    assert schemas["partner_of"]["function"]["parameters"]["required"] == ["name"]


def test_the_rows_are_the_scripts_and_only_the_demonstrations_hold_conversations(tmp_path):
    written = tmp_path / "chain.jsonl"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_chain.py"), str(written)], check=True, capture_output=True)
    assert written.read_text() == BUNDLED_SETS["bundled:chain"].read_text()  # the bundled file is the script's output
    splits = {split: examples_from_dataset(load_dataset_spec("bundled:chain", split, "dataset"), "dataset")
              for split in SPLITS}
    assert {split: len(rows) for split, rows in splits.items()} == SPLITS
    entries = {split: {e.row["entry"] for e in rows} for split, rows in splits.items()}
    assert not entries["train"] & entries["heldout"] and not entries["demonstrations"] & (entries["train"] | entries["heldout"])
    assert all(e.completion is None and e.turns is None for e in splits["train"] + splits["heldout"])
    for example in splits["demonstrations"]:
        entry, partner = example.row["entry"], PARTNERS[example.row["entry"]]
        turns = example.turns
        assert turns is not None and example.answer == REGISTRY[partner]
        calls = [(t["tool_calls"][0]["function"]["name"], json.loads(t["tool_calls"][0]["function"]["arguments"]))
                 for t in turns if t.get("tool_calls")]
        assert calls == [("partner_of", {"name": entry}), ("code_of", {"name": partner})]  # the second needs the first
        results = [t["content"] for t in turns if t["role"] == "tool"]
        assert results == [partner_of(entry), code_of(partner)]
        assert example.answer in turns[-1]["content"] and example.answer not in example.prompt[0]["content"]
