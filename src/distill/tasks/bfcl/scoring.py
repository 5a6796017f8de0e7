"""A generated turn's function calls scored against a BFCL row: a reward function and an evaluation metric.

The calls are read from the text in the Hermes format (`parse_tool_calls`:
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format the task's rows are written in and the tool
loop reads for a template that writes no other), then judged by BFCL's AST rules (`checker.py`) against
the row's `bfcl` column (`rows.py`). A block that does not parse makes the turn undecodable: it fails, as an output
BFCL's decoder cannot read does. Only the single-turn categories are scored this way; a multi-turn row's score is
its environment's reward (`environment.py`).

    reward_funcs: [distill.tasks.bfcl.scoring:calls_reward]    # grpo / sdpo: 1.0 for a right turn, else 0.0

The evaluation reports `bfcl` (correct, rows, accuracy, the failures by BFCL's error type) over the evaluation rows
that carry an AST `bfcl` column, and `bfcl_calls`, each row's id, answer and decoded calls: what
`scripts/bfcl_official_check.sh` scores again with BFCL's own checker.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from distill.conversations.tool_calls import parse_tool_calls
from distill.tasks.bfcl.checker import Call, Verdict, check_calls
from distill.tasks.bfcl.rows import AST_CATEGORIES

UNDECODABLE = "ast_decoder:decoder_failed"


@dataclass(frozen=True)
class AstTask:
    """What a single-turn row is scored against: its id, category, BFCL function documents and accepted answer."""

    id: str
    category: str
    functions: list[dict[str, Any]]
    answer: list[Call]

    @classmethod
    def of(cls, row: dict[str, Any]) -> "AstTask | None":
        """The row's task, or None for a row without a `bfcl` column or of a multi-turn category."""
        bfcl = row.get("bfcl")
        if bfcl is None:
            return None
        task = json.loads(bfcl) if isinstance(bfcl, str) else bfcl
        if task.get("category") not in AST_CATEGORIES:
            return None
        return cls(task["id"], task["category"], task["functions"], task["answer"])


def decoded_calls(text: str) -> list[Call] | None:
    """The calls a generated turn holds, in BFCL's form; None when a call block does not parse."""
    parsed = parse_tool_calls(text)
    if parsed.malformed:
        return None
    return [{call.name: call.arguments} for call in parsed.calls]


def score_calls(calls: list[Call] | None, task: AstTask) -> Verdict:
    if calls is None:
        return Verdict(False, UNDECODABLE, "a tool-call block does not parse")
    return check_calls(task.functions, calls, task.answer, task.category)


def calls_reward(prompts: list, completions: list[str], rows: list[dict[str, Any]]) -> list[float]:
    """1.0 for each completion whose calls pass BFCL's rules for its row, else 0.0; ValueError for a row without an
    AST `bfcl` column."""
    rewards = []
    for text, row in zip(completions, rows):
        task = AstTask.of(row)
        if task is None:
            raise ValueError("calls_reward scores rows with a 'bfcl' column of a single-turn category (written by "
                             "`python -m distill.tasks.bfcl`); a multi-turn row's reward is its environment's")
        rewards.append(float(score_calls(decoded_calls(text), task).valid))
    return rewards


calls_reward.reward_range = (0.0, 1.0)  # type: ignore[attr-defined]


def evaluate_calls(rows: list[dict[str, Any]], texts: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """({"correct", "rows", "accuracy", "errors": {error type: count}}, per scored row {"id", "text", "calls", "valid",
    "error_type"}) over the rows with an AST `bfcl` column; None when there is none."""
    scored, verdicts = [], []
    for row, text in zip(rows, texts):
        task = AstTask.of(row)
        if task is None:
            continue
        calls = decoded_calls(text)
        verdicts.append(score_calls(calls, task))
        scored.append({"id": task.id, "text": text, "calls": calls, "valid": verdicts[-1].valid,
                       "error_type": verdicts[-1].error_type})
    if not scored:
        return None
    correct = sum(verdict.valid for verdict in verdicts)
    errors = Counter(verdict.error_type for verdict in verdicts if not verdict.valid)
    return ({"correct": correct, "rows": len(scored), "accuracy": correct / len(scored), "errors": dict(sorted(errors.items()))},
            scored)
