"""`distill train` and `distill eval` on a cross-tokenizer pair saved to disk."""

from __future__ import annotations

import json

from distill.cli import main
from tests.conftest import tiny_lm
from tests.methods.gold.test_gold_training import gold_rows


def test_train_and_eval_report_the_aligned_divergence(tmp_path, tokenizer, smol_tokenizer, smol_teacher, capsys):
    teacher_dir, student_dir = tmp_path / "teacher", tmp_path / "student"
    smol_teacher.save_pretrained(teacher_dir)
    smol_tokenizer.save_pretrained(teacher_dir)
    tiny_lm(len(tokenizer), layers=1, seed=2, eos_token_id=tokenizer.eos_token_id).save_pretrained(student_dir)
    tokenizer.save_pretrained(student_dir)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in gold_rows(4)))
    run = tmp_path / "run"
    assert main(["train", "--method", "gold", "--teacher", str(teacher_dir), "--student", str(student_dir), "--dataset", str(data),
                 "--eval_dataset", str(data), "--eval_split", "train", "--eval_max_prompts", "2", "--eval_max_new_tokens", "6",
                 "--eval_examples", "1", "--max_steps", "1", "--max_new_tokens", "6", "--per_device_train_batch_size", "2",
                 "--gradient_accumulation_steps", "1", "--lmbda", "0", "--lmbda_schedule", "constant", "--progress_bar", "false",
                 "--output_dir", str(run)]) == 0
    assert "Aligned divergence (ULD) on teacher completions" in capsys.readouterr().out
    assert main(["eval", str(run), "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    after = json.loads((run / "eval" / "eval.json").read_text())["metrics"]["after"]["on_teacher_completions"]
    got = report["metrics"]["student"]["on_teacher_completions"]
    assert set(got) == {"aligned_divergence", "tokens"}
    assert abs(got["aligned_divergence"] - after["aligned_divergence"]) <= 1e-5 * after["aligned_divergence"]
