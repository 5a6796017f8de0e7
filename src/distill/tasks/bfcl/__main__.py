"""`python -m distill.tasks.bfcl --out DIR`: BFCL rows for distill, split into train and held-out sets.

Writes DIR/bfcl.jsonl (the single-turn categories' rows, `split` "train" or "heldout": no function is in both,
`split.py`) and DIR/split.json (the seed, the fraction, the categories, the row counts and both sides' function
names); with `--multi-turn CATEGORY`, DIR/CATEGORY.jsonl too (its rows split by entry with the same seed and
fraction: they all share the back-ends' functions). The data is the installed bfcl-eval package's, or `--data DIR`.
Train with `dataset: DIR/bfcl.jsonl` and evaluate on `eval_dataset: DIR/bfcl.jsonl` (eval_split is "heldout").
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from distill.tasks.bfcl.rows import AST_CATEGORIES, MULTI_TURN_CATEGORIES, category_rows, installed_data_dir
from distill.tasks.bfcl.split import split_by_function


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m distill.tasks.bfcl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder to write bfcl.jsonl and split.json into")
    parser.add_argument("--data", type=Path, default=None, help="BFCL's data folder (default: the installed bfcl-eval's)")
    parser.add_argument("--categories", nargs="+", default=["simple_python", "multiple"], choices=AST_CATEGORIES)
    parser.add_argument("--heldout-fraction", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tools-in-prompt", action="store_true",
                        help="schemas in the system message and calls in the completion's text, no `tools` column "
                             "(methods that sample run without a tool to execute the calls)")
    parser.add_argument("--multi-turn", choices=MULTI_TURN_CATEGORIES, default=None,
                        help="also write this multi-turn category's rows, for the environment")
    args = parser.parse_args(argv)
    try:
        data = args.data or installed_data_dir()
        rows = [row for category in args.categories for row in category_rows(data, category, args.tools_in_prompt)]
        split = split_by_function(rows, args.heldout_fraction, args.seed)
        multi_turn = category_rows(data, args.multi_turn) if args.multi_turn else []
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.out / "bfcl.jsonl", [row | {"split": "train"} for row in split.train] +
                [row | {"split": "heldout"} for row in split.heldout])
    record = {"seed": args.seed, "heldout_fraction": args.heldout_fraction, "categories": args.categories,
              "rows": {"train": len(split.train), "heldout": len(split.heldout)},
              "train_functions": split.train_functions, "heldout_functions": split.heldout_functions}
    if multi_turn:
        order = list(range(len(multi_turn)))
        random.Random(args.seed).shuffle(order)
        held = set(order[: round(args.heldout_fraction * len(multi_turn))])
        write_jsonl(args.out / f"{args.multi_turn}.jsonl",
                    [row | {"split": "heldout" if i in held else "train"} for i, row in enumerate(multi_turn)])
        record["multi_turn"] = {"category": args.multi_turn, "heldout_ids": sorted(multi_turn[i]["id"] for i in held)}
    (args.out / "split.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out / 'bfcl.jsonl'}: {len(split.train)} train rows ({len(split.train_functions)} functions), "
          f"{len(split.heldout)} held-out rows ({len(split.heldout_functions)} functions)"
          + (f"; {args.out / (args.multi_turn + '.jsonl')}: {len(multi_turn)} rows" if multi_turn else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
