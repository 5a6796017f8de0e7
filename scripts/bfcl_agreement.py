"""distill's side of `bfcl_official_check.sh`: the answers to check, and both scores with their agreement.

    python scripts/bfcl_agreement.py answers SOURCE [EVALUATION] > ANSWERS.jsonl
        SOURCE: a run's eval/eval.json (its `bfcl_calls` of EVALUATION, default the last one: "after", or
        "student" for `distill eval`) or JSON Lines of {"id", "text"}; writes {"id", "text", "calls"} lines, the
        calls as distill decodes the text (null when a block does not parse).
    python scripts/bfcl_agreement.py examples [--rows N] [--seed S] [--data DIR] > ANSWERS.jsonl
        hand-made answers to real BFCL questions (simple_python, multiple, parallel): for each of N rows of each, a
        right answer and wrong or odd ones (another value, a missing or an unknown argument, another function,
        prose, a broken block beside a right call, a call written on one line).
    python scripts/bfcl_agreement.py compare ANSWERS.jsonl OFFICIAL.jsonl [--data DIR] [--json PATH]
        scores ANSWERS with distill's scorer (`distill.tasks.bfcl.scoring`, the rows of BFCL's data in DIR, default
        the installed bfcl-eval's) beside BFCL's verdicts (`bfcl_official_score.py`), and prints both accuracies,
        how often the two agree on the whole answer (each decoding the text its own way) and on the same calls
        (distill's decoding judged by both checkers), and every answer they disagree on.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from distill.conversations.tool_calls import ToolCall, render_tool_calls  # noqa: E402
from distill.tasks.bfcl.rows import category_rows, installed_data_dir  # noqa: E402
from distill.tasks.bfcl.scoring import AstTask, decoded_calls, score_calls  # noqa: E402


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def answers(source: Path, evaluation: str | None) -> list[dict]:
    if source.suffix == ".json":
        report = json.loads(source.read_text())
        if "bfcl_calls" not in report:
            raise SystemExit(f"{source} holds no BFCL answers ('bfcl_calls'): was the evaluation on BFCL rows?")
        names = list(report["bfcl_calls"])
        name = evaluation or names[-1]
        if name not in names:
            raise SystemExit(f"{source} has no evaluation {name!r}; it has {names}")
        entries = report["bfcl_calls"][name]
    else:
        entries = read_lines(source)
    return [{"id": e["id"], "text": e["text"], "calls": decoded_calls(e["text"])} for e in entries]


def _call_text(calls: list[ToolCall]) -> str:
    return render_tool_calls(calls)


def examples(rows_per_category: int, seed: int, data: Path | None) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for category in ("simple_python", "multiple", "parallel"):
        rows = category_rows(data or installed_data_dir(), category)
        for row in rng.sample(rows, rows_per_category):
            right = [ToolCall(c["function"]["name"], json.loads(c["function"]["arguments"]))
                     for c in row["completion"][0]["tool_calls"]]
            first = right[0]
            key = next(iter(first.arguments))
            value = first.arguments[key]
            other = value + 1 if isinstance(value, (int, float)) and not isinstance(value, bool) else "something else"
            texts = {
                "right": _call_text(right),
                "right after words": "Sure, here is the call.\n" + _call_text(right),
                "another value": _call_text([ToolCall(first.name, first.arguments | {key: other})] + right[1:]),
                "a missing argument": _call_text([ToolCall(first.name, {k: v for k, v in first.arguments.items() if k != key})]
                                                 + right[1:]),
                "an unknown argument": _call_text([ToolCall(first.name, first.arguments | {"verbose": True})] + right[1:]),
                "another function": _call_text([ToolCall(first.name + "_v2", first.arguments)] + right[1:]),
                "a number as text": _call_text([ToolCall(first.name, first.arguments | {key: str(value)})] + right[1:]),
                "prose": "I cannot call functions, but the answer is probably 42.",
                "a broken block beside a right call": _call_text(right) + "\n<tool_call>\n{\"name\": oops}\n</tool_call>",
                "a call on one line": "".join(f'<tool_call>{json.dumps({"name": c.name, "arguments": c.arguments})}</tool_call>'
                                              for c in right),
            }
            out += [{"id": row["id"], "kind": kind, "text": text} for kind, text in texts.items()]
    return out


def compare(answers_path: Path, official_path: Path, data: Path | None) -> dict:
    mine, theirs = read_lines(answers_path), read_lines(official_path)
    if [a["id"] for a in mine] != [o["id"] for o in theirs]:
        raise SystemExit(f"{answers_path} and {official_path} do not list the same ids in the same order")
    data = data or installed_data_dir()
    tasks: dict[str, AstTask] = {}
    for category in sorted({a["id"].rsplit("_", 1)[0] for a in mine}):
        tasks |= {row["id"]: AstTask.of(row) for row in category_rows(data, category)}
    verdicts = [score_calls(decoded_calls(a["text"]), tasks[a["id"]]) for a in mine]
    n = len(mine)
    same_calls = [(v, o) for v, o in zip(verdicts, theirs) if o["calls_valid"] is not None]
    disagreements = [{"id": a["id"], "kind": a.get("kind"), "distill": v.error_type or "right",
                      "bfcl": o["text_error_type"] or "right", "text": a["text"]}
                     for a, v, o in zip(mine, verdicts, theirs) if v.valid != o["text_valid"]]
    return {"answers": n, "distill_accuracy": sum(v.valid for v in verdicts) / n,
            "bfcl_accuracy": sum(o["text_valid"] for o in theirs) / n,
            "agreement": sum(v.valid == o["text_valid"] for v, o in zip(verdicts, theirs)) / n,
            "same_calls": len(same_calls),
            "same_calls_agreement": sum(v.valid == o["calls_valid"] for v, o in same_calls) / max(len(same_calls), 1),
            "same_calls_error_type_agreement": sum(v.error_type == o["calls_error_type"] for v, o in same_calls)
            / max(len(same_calls), 1),
            "disagreements": disagreements}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    given = commands.add_parser("answers")
    given.add_argument("source", type=Path)
    given.add_argument("evaluation", nargs="?", default=None)
    made = commands.add_parser("examples")
    made.add_argument("--rows", type=int, default=10)
    made.add_argument("--seed", type=int, default=0)
    made.add_argument("--data", type=Path, default=None)
    checked = commands.add_parser("compare")
    checked.add_argument("answers", type=Path)
    checked.add_argument("official", type=Path)
    checked.add_argument("--data", type=Path, default=None)
    checked.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command in ("answers", "examples"):
        found = answers(args.source, args.evaluation) if args.command == "answers" else examples(args.rows, args.seed,
                                                                                                  args.data)
        for entry in found:
            entry.setdefault("calls", decoded_calls(entry["text"]))
            print(json.dumps(entry, ensure_ascii=False))
        return 0
    result = compare(args.answers, args.official, args.data)
    print(f"answers: {result['answers']}")
    print(f"distill's scorer: {result['distill_accuracy']:.4f} right;  BFCL's checker: {result['bfcl_accuracy']:.4f} right")
    print(f"agreement on the whole answer (each decodes the text): {result['agreement']:.4f}")
    print(f"agreement on the same calls (distill's decoding, both checkers): {result['same_calls_agreement']:.4f} of "
          f"{result['same_calls']} (error types equal: {result['same_calls_error_type_agreement']:.4f})")
    for entry in result["disagreements"]:
        print(f"  disagree: {entry['id']} ({entry['kind']}): distill {entry['distill']}, BFCL {entry['bfcl']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
