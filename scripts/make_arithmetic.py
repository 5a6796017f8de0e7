"""Write src/distill/recipes/data/arithmetic.jsonl: a task with rule-checkable answers for RL (sdpo / GRPO).

Every ordered pair (a, b) with a, b in 2..21 (400 pairs) gives one row asking "What is a + b? Answer with
the number only." with answer a + b. The pairs are shuffled with a fixed seed; the first 300 are the
"train" split, the other 100 the "heldout" split (no pair is in both; a + b and b + a are different rows
and may fall in different splits, as a model can learn addition, not the pair).

Measured while planning: SmolLM2-135M-Instruct answers such questions correctly in about 17% of samples
at temperature 1 (1 to 3 of 8 per prompt), so groups of 8 hold successes and failures: what GRPO needs
for an advantage and SDPO for a demonstration.

Row format: {"a": int, "b": int, "split": "train" | "heldout",
             "prompt": [{"role": "user", "content": "What is A + B? Answer with the number only."}],
             "answer": "A+B as a decimal string"}
Deterministic (fixed seed, standard library only): `python scripts/make_arithmetic.py [OUTPUT]`.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

SEED = 20261201
LOW, HIGH = 2, 21
TRAIN = 300
OUTPUT = Path(__file__).resolve().parent.parent / "src" / "distill" / "recipes" / "data" / "arithmetic.jsonl"


def rows() -> list[dict]:
    pairs = [(a, b) for a in range(LOW, HIGH + 1) for b in range(LOW, HIGH + 1)]
    random.Random(SEED).shuffle(pairs)
    return [{"a": a, "b": b, "split": "train" if i < TRAIN else "heldout",
             "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}],
             "answer": str(a + b)} for i, (a, b) in enumerate(pairs)]


def main() -> None:
    output = Path(sys.argv[1]) if len(sys.argv) > 1 else OUTPUT
    output.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
