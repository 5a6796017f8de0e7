"""The chain task: questions whose answer takes two dependent tool calls, about an invented registry.

Every entry of the registry (`REGISTRY`, fixed by a seed) has a 4-digit code and a partner, another entry
(`PARTNERS`). A question asks for the code of an entry's partner: `partner_of(name)` names the partner, then
`code_of(partner)` gives its code. Neither call alone answers, the second needs the first's result, and no model knows
the registry, so a right answer comes only from both calls, in order.

The rows (`bundled:chain`, written by `scripts/make_chain.py`) come in three splits over three disjoint groups of
entries, each group's partners within it, so no split's answers can be read off another split's tool results:
- `demonstrations`: a question, its answer and the conversation of a model using the tools well (the two calls,
  their results, the answer), for the teacher's `sft`;
- `train`: a question and its answer, and no conversation: prompts only. Whatever a student learns on them comes from
  a teacher's behaviour (on-policy distillation), not from the rows;
- `heldout`: the same, on the third group, for the evaluation (task success: the final answer holds the code).
"""

from __future__ import annotations

import random

SEED = 20261205
ENTRIES = 240
SPLITS = {"demonstrations": 80, "train": 120, "heldout": 40}  # entries per split; a split's partners stay in it
SYLLABLES = ["ab", "bel", "cas", "dor", "el", "fim", "gar", "hol", "is", "jan", "kes", "lor", "mab", "nim", "ost",
             "pim", "quor", "ras", "sil", "tov", "ul", "vas", "wim", "xan", "yor", "zet"]
ENDINGS = ["a", "an", "ek", "ine", "o", "ul", "ys"]


def _names() -> list[str]:
    rng = random.Random(SEED)
    names: list[str] = []
    while len(names) < ENTRIES:
        name = (rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + rng.choice(ENDINGS)).capitalize()
        if name not in names:
            names.append(name)
    return names


def _registry() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(code of each entry, partner of each entry, split of each entry): each split's entries paired in one cycle."""
    rng = random.Random(SEED + 1)
    names = _names()
    rng.shuffle(names)
    codes = {name: str(rng.randrange(1000, 10000)) for name in names}
    partners: dict[str, str] = {}
    splits: dict[str, str] = {}
    start = 0
    for split, count in SPLITS.items():
        group = names[start : start + count]
        start += count
        for index, name in enumerate(group):
            partners[name] = group[(index + 1) % count]
            splits[name] = split
    return codes, partners, splits


REGISTRY, PARTNERS, SPLIT_OF = _registry()


def _entry(name: str) -> str | None:
    key = name.strip().capitalize()
    return key if key in REGISTRY else None


def partner_of(name: str) -> str:
    """Names the partner of a registry entry.

    Args:
        name: the entry's name, as the question writes it
    """
    entry = _entry(name)
    if entry is None:
        return f"no entry named {name!r} in the registry"
    return f"The partner of {entry} is {PARTNERS[entry]}."


def code_of(name: str) -> str:
    """Gives the registry code of an entry.

    Args:
        name: the entry's name
    """
    entry = _entry(name)
    if entry is None:
        return f"no entry named {name!r} in the registry"
    return f"The code of {entry} is {REGISTRY[entry]}."
