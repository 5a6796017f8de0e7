"""Write src/distill/recipes/data/lookup.jsonl: the lookup task's rows (`distill.tasks.lookup`).

One row per registry entry: two thirds "train", one third "heldout" (entries the training rows never name). Row:

    {"entry": NAME, "split": "train" | "heldout",
     "prompt": [{"role": "user", "content": QUESTION}],
     "answer": CODE,                       # the 4-digit code, found verbatim in a right answer
     "completion": [                       # how a model that uses the tool well answers (for sft)
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
            {"name": "lookup_code", "arguments": "{\"name\": NAME}"}}]},
        {"role": "tool", "name": "lookup_code", "content": RESULT},
        {"role": "assistant", "content": ANSWER_SENTENCE}]}

Deterministic (the registry's seed, standard library only): `python scripts/make_lookup.py` overwrites the file.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from distill.tasks.lookup import REGISTRY, SEED, lookup_code  # noqa: E402

OUTPUT = Path(__file__).resolve().parent.parent / "src" / "distill" / "recipes" / "data" / "lookup.jsonl"
QUESTIONS = ["What is the registry code of {name}?", "Which code does the registry give {name}?",
             "Tell me the registry code of {name}.", "I need the code of {name} from the registry."]


def rows() -> list[dict]:
    rng = random.Random(SEED + 1)
    names = list(REGISTRY)
    rng.shuffle(names)
    out = []
    for index, name in enumerate(names):
        question = rng.choice(QUESTIONS).format(name=name)
        result = lookup_code(name)
        call = {"type": "function", "function": {"name": "lookup_code", "arguments": json.dumps({"name": name})}}
        out.append({"entry": name, "split": "heldout" if index % 3 == 2 else "train",
                    "prompt": [{"role": "user", "content": question}], "answer": REGISTRY[name],
                    "completion": [{"role": "assistant", "content": "", "tool_calls": [call]},
                                   {"role": "tool", "name": "lookup_code", "content": result},
                                   {"role": "assistant", "content": result}]})
    return out


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT
    target.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows()))
    print(f"wrote {target}")
