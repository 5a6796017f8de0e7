"""`distill train` and `distill eval RUN_DIR` of a run with tools, from the command line: the evaluation runs the
run's tools in greedy conversations and reports tool use before and after, the conversations side by side."""

from __future__ import annotations

import json

from distill.cli import main
from tests.conversations.test_training import _recipe, scripted_turns


def test_distill_eval_of_a_run_with_tools_reports_tool_use_and_the_conversations(tmp_path, model_dirs, tokenizer,
                                                                                 monkeypatch):
    import distill.evaluation.evaluator
    import distill.teachers.local
    import distill.training.student_sampler

    generate, _, _ = scripted_turns(tokenizer)
    for module in (distill.training.student_sampler, distill.teachers.local, distill.evaluation.evaluator):
        monkeypatch.setattr(module, "generate_completions", generate)
    rows = [{"prompt": [{"role": "user", "content": f"What is 2 + {i}?"}], "answer": "5"} for i in range(6)]
    recipe = _recipe(tmp_path, model_dirs, rows, method="on_policy", tools=["tests.conversations.toolbox:plus"],
                     max_turns=3, max_prompt_length=300, max_new_tokens=150)
    run = tmp_path / "run"
    assert main(["train", recipe, "--output-dir", str(run)]) == 0
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps(row) + "\n" for row in rows[:3]))
    assert main(["eval", str(run), "--dataset", str(held_out), "--split", "train", "--max-new-tokens", "150",
                 "--device", "cpu"]) == 0
    report = json.loads((run / "eval-cli" / "eval.json").read_text())
    student = report["metrics"]["student"]
    assert student["tool_use"]["calls_per_question"] == 1.0 and student["tool_use"]["valid_call_rate"] == 1.0
    assert student["answer_accuracy"]["accuracy"] == 1.0
    shown = report["examples"][0]
    conversation = next(value for key, value in shown.items() if key.startswith("student"))
    assert "tool\n5" in conversation and conversation.endswith("It is 5.")
    assert "Tool use of the greedy conversations" in (run / "eval-cli" / "eval.md").read_text()
