"""Score answers to BFCL questions with BFCL's own code, in the environment `bfcl_official_check.sh` makes (the
package bfcl-eval with its dependencies); it imports nothing of distill.

Reads JSON Lines `{"id": BFCL id, "text": the model's answer, "calls": distill's decoding of it or null}` and writes,
per line, `{"id", "text_valid", "text_error_type", "calls_valid", "calls_error_type"}`:

- text: BFCL's whole path for one entry (`_evaluate_single_ast_entry`): its Hermes-format decoder (the handler of
  Qwen/Qwen3-0.6B-FC, a model that writes `<tool_call>` blocks as distill does), its output-format check, its AST
  checker;
- calls: BFCL's AST checker on distill's decoding of the same text (null where distill could not decode it).

    python scripts/bfcl_official_score.py ANSWERS.jsonl > OFFICIAL.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import bfcl_eval
from bfcl_eval.constants.enums import Language, ReturnFormat
from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
from bfcl_eval.eval_checker.eval_runner import _evaluate_single_ast_entry, get_handler

MODEL = "Qwen/Qwen3-0.6B-FC"
RESULT_NAME = MODEL.replace("/", "_")  # how BFCL's runner names a model's results (its checker maps "_" back)
DATA = Path(bfcl_eval.__file__).parent / "data"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def category_of(entry_id: str) -> str:
    return entry_id.rsplit("_", 1)[0]


def main(path: str) -> int:
    answers = lines(Path(path))
    entries: dict[str, dict] = {}
    truths: dict[str, list] = {}
    for category in sorted({category_of(answer["id"]) for answer in answers}):
        entries |= {e["id"]: e for e in lines(DATA / f"BFCL_v4_{category}.json")}
        truths |= {e["id"]: e["ground_truth"] for e in lines(DATA / "possible_answer" / f"BFCL_v4_{category}.json")}
    handler = get_handler(MODEL)
    for answer in answers:
        entry_id = answer["id"]
        category = category_of(entry_id)
        whole = _evaluate_single_ast_entry(handler, entry_id, answer["text"], truths[entry_id], entries[entry_id],
                                           RESULT_NAME, category, language=Language.PYTHON,
                                           return_format=ReturnFormat.PYTHON)
        out = {"id": entry_id, "text_valid": bool(whole["valid"]),
               "text_error_type": "" if whole["valid"] else whole["error_type"]}
        if answer.get("calls") is None:
            out |= {"calls_valid": None, "calls_error_type": None}
        else:
            checked = ast_checker(entries[entry_id]["function"], answer["calls"], truths[entry_id], Language.PYTHON,
                                  category, RESULT_NAME)
            out |= {"calls_valid": bool(checked["valid"]),
                    "calls_error_type": "" if checked["valid"] else checked["error_type"]}
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
