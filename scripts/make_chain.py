"""Write src/distill/recipes/data/chain.jsonl: the chain task's rows (`distill.tasks.chain`).

One row per registry entry, in its split (`demonstrations`, `train`, `heldout`: disjoint entries). Row:

    {"entry": NAME, "split": SPLIT,
     "prompt": [{"role": "user", "content": QUESTION}],     # the code of NAME's partner
     "answer": CODE,                                        # the partner's 4-digit code, verbatim in a right answer
     "completion": [...]}                                   # demonstrations only: partner_of(NAME), its result,
                                                            # code_of(PARTNER), its result, the answer (for sft)

Deterministic (the registry's seed, standard library only): `python scripts/make_chain.py` overwrites the file.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from distill.tasks.chain import PARTNERS, REGISTRY, SEED, SPLIT_OF, code_of, partner_of  # noqa: E402

OUTPUT = Path(__file__).resolve().parent.parent / "src" / "distill" / "recipes" / "data" / "chain.jsonl"
QUESTIONS = ["What is the registry code of {name}'s partner?", "Which code does the registry give the partner of {name}?",
             "Find the partner of {name} and tell me that partner's code.", "I need the code of {name}'s partner."]


def _call(function: str, name: str) -> dict:
    return {"type": "function", "function": {"name": function, "arguments": json.dumps({"name": name})}}


def rows() -> list[dict]:
    rng = random.Random(SEED + 2)
    out = []
    for name in sorted(REGISTRY):
        partner = PARTNERS[name]
        row = {"entry": name, "split": SPLIT_OF[name],
               "prompt": [{"role": "user", "content": rng.choice(QUESTIONS).format(name=name)}],
               "answer": REGISTRY[partner]}
        if SPLIT_OF[name] == "demonstrations":
            row["completion"] = [
                {"role": "assistant", "content": "", "tool_calls": [_call("partner_of", name)]},
                {"role": "tool", "name": "partner_of", "content": partner_of(name)},
                {"role": "assistant", "content": "", "tool_calls": [_call("code_of", partner)]},
                {"role": "tool", "name": "code_of", "content": code_of(partner)},
                {"role": "assistant", "content": f"The partner of {name} is {partner}, whose code is {REGISTRY[partner]}."}]
        out.append(row)
    rng.shuffle(out)
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT
    target.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows()))
    print(f"wrote {target}")
