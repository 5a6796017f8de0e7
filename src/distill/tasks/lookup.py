"""The lookup task: questions about an invented registry that only its tool can answer.

Every entry is an invented name with a 4-digit code (`REGISTRY`, fixed by a seed), so no model knows a code
beforehand; the held-out questions ask about entries the training questions never name, so a model answers them only
by calling the tool, not by remembering codes. `lookup_code(name)` is the tool (`tools:
[distill.tasks.lookup:lookup_code]`); `scripts/make_lookup.py` writes the rows (`bundled:lookup`): each a question,
its `answer` (the code), and a `completion` that is the conversation a model using the tool well would have (the call,
the result, the answer), for `sft` (and the teacher it makes).
"""

from __future__ import annotations

import random

SEED = 20261203
ENTRIES = 96
SYLLABLES = ["bal", "bren", "cor", "dar", "del", "dun", "fen", "gal", "gor", "har", "jor", "kel", "kor", "lin", "lum",
             "mar", "mir", "mor", "nev", "nor", "pel", "quen", "ral", "ril", "sel", "sor", "tal", "tem", "thar", "tor",
             "vel", "ven", "vor", "wen", "yar", "zan", "zel", "zor"]
ENDINGS = ["ia", "ar", "eth", "ond", "ix", "ora", "um", "ell"]


def _registry() -> dict[str, str]:
    rng = random.Random(SEED)
    entries: dict[str, str] = {}
    while len(entries) < ENTRIES:
        name = (rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + rng.choice(ENDINGS)).capitalize()
        if name not in entries:
            entries[name] = str(rng.randrange(1000, 10000))
    return entries


REGISTRY = _registry()


def lookup_code(name: str) -> str:
    """Looks up the registry code of a named entry.

    Args:
        name: the entry's name, as the question writes it
    """
    code = REGISTRY.get(name.strip().capitalize())
    if code is None:
        return f"no entry named {name!r} in the registry"
    return f"The code of {name.strip().capitalize()} is {code}."
