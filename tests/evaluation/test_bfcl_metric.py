"""`distill eval` on BFCL rows reports how many greedy answers call the right function with right arguments (BFCL's
AST rules), the failures by kind, and every row's decoded calls in eval.json for BFCL's own checker; on conversations
with an environment that owns a reward (BFCL's multi-turn back-ends), the reward's mean."""

from __future__ import annotations

import json

from distill.cli import main
from distill.conversations.tool_calls import ToolCall, render_tool_calls
from distill.generation.sample import Sample
from distill.tasks.bfcl.rows import category_rows
from tests.tasks.bfcl.test_rows import write_category

SQUARE = {"name": "square", "description": "Square a number.", "parameters": {
    "type": "dict", "required": ["x"], "properties": {"x": {"type": "integer", "description": "the number"}}}}
ANSWERS = {  # what the scripted model answers to each question
    "Square 3.": render_tool_calls([ToolCall("square", {"x": 3})]),
    "Square 4.": render_tool_calls([ToolCall("square", {"x": 5})]),
    "Square 5.": "It is 25.",
}


def test_distill_eval_scores_the_greedy_calls_by_bfcls_rules(tmp_path, model_dirs, tokenizer, monkeypatch):
    import distill.evaluation.evaluator
    import distill.teachers.local

    questions = list(ANSWERS)
    write_category(tmp_path / "bfcl", "simple_python",
                   [{"id": f"simple_python_{i}", "question": [[{"role": "user", "content": q}]], "function": [SQUARE]}
                    for i, q in enumerate(questions)],
                   [{"id": f"simple_python_{i}", "ground_truth": [{"square": {"x": [int(q.split()[1][0])]}}]}
                    for i, q in enumerate(questions)])
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in category_rows(tmp_path / "bfcl", "simple_python")))

    def generate(model, prompts, sampling, *args, **kwargs):
        out = []
        for prompt in prompts:
            text = next(answer for question, answer in ANSWERS.items() if question in tokenizer.decode(prompt))
            ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[: sampling.max_new_tokens]
            out.append(Sample(ids, False, None))
        return out

    for module in (distill.teachers.local, distill.evaluation.evaluator):
        monkeypatch.setattr(module, "generate_completions", generate)
    out = tmp_path / "eval"
    assert main(["eval", str(model_dirs["student"]), "--teacher", str(model_dirs["teacher"]), "--dataset", str(data),
                 "--split", "train", "--max-new-tokens", "60", "--device", "cpu", "--out", str(out)]) == 0
    report = json.loads((out / "eval.json").read_text())
    (name,) = report["metrics"]
    assert report["metrics"][name]["bfcl"] == {"correct": 1, "rows": 3, "accuracy": 1 / 3, "errors": {
        "simple_function_checker:wrong_count": 1, "value_error:others": 1}}
    assert report["bfcl_calls"][name] == [
        {"id": "simple_python_0", "text": ANSWERS["Square 3."], "calls": [{"square": {"x": 3}}], "valid": True,
         "error_type": ""},
        {"id": "simple_python_1", "text": ANSWERS["Square 4."], "calls": [{"square": {"x": 5}}], "valid": False,
         "error_type": "value_error:others"},
        {"id": "simple_python_2", "text": "It is 25.", "calls": [], "valid": False,
         "error_type": "simple_function_checker:wrong_count"}]
    assert "BFCL calls right by its AST rules" in (out / "eval.md").read_text()


def test_the_tool_use_of_conversations_with_an_environments_reward_reports_its_mean():
    from distill.agents.loop import Trajectory
    from distill.evaluation.evaluator import tool_use, tool_use_lines

    rewarded = [Trajectory(turns=2, calls=1, reward=1.0), Trajectory(turns=3, calls=2, reward=0.0), Trajectory(turns=1)]
    use = tool_use(rewarded)
    assert use["environment_reward"] == 0.5 and use["calls_per_question"] == 1.0
    assert "environment_reward" not in tool_use(rewarded[2:])
    (line,) = [line for line in tool_use_lines({"metrics": {"after": {"tool_use": use}}}) if line]
    assert line.endswith("after 1.00 calls and 2.00 turns per question, 1.000 of calls valid, environment reward 0.500.")
