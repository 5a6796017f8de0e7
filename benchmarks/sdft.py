"""Learning new facts without forgetting: sft vs sdft (base and EMA self-teacher) at equal wall time, on CPU.

SmolLM2-135M-Instruct (the default model) is the student. The bundled knowledge-injection set
(`bundled:facts`: invented facts, one training question per fact, two held-out paraphrases) is the task:
the model cannot know the facts, and answers them when shown the fact (measured below as the self-teacher's
accuracy). Every arm trains for the same number of minutes (`distill train --max_time_minutes`), then is
measured in this process:

- new knowledge: greedy answers to the held-out paraphrases (and the training questions) that contain the
  answer string (`distill.tasks.answers.contains_answer`);
- forgetting: forward KL(original model || student) on the original model's samples of the bundled general
  held-out prompts (the evaluation of `distill train`, with the original model as teacher), and three
  general answers side by side.

    python benchmarks/sdft.py --minutes 6 [--resume]
Writes benchmarks/results/sdft.json and prints a table. Runs are sequential (one at a time on the machine).
--resume keeps the arms of an earlier invocation that finished (each writes bench_row.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from provenance import write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arms import run_arms  # noqa: E402  (a sibling script)

from distill.data import examples_from_dataset
from distill.data_files import BUNDLED_DATASET, load_dataset_spec
from distill.evaluation.evaluator import EvalSettings, Evaluator
from distill.evaluation.leakage import template_leakage
from distill.generation import SamplingParams, generate_completions
from distill.methods.self_teacher_prompts import (
    DEFAULT_TEACHER_PROMPT_TEMPLATE,
    TeacherPrompts,
)
from distill.models import DEFAULT_TEACHER, eos_token_ids, student_vocab_size
from distill.rendering import TextRenderer
from distill.tasks.answers import contains_answer
from distill.teachers.build import load_model
from distill.teachers.self_teacher import SelfTeacher

FACTS = "bundled:facts"
COMMON = ["--dataset", FACTS, "--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "5", "--learning_rate", "1e-4",
          "--max_steps", "10000", "--save_steps", "0", "--progress_bar", "false", "--eval_before_after", "false",
          "--max_new_tokens", "32", "--logging_steps", "5"]
ARMS = {  # name: (run directory, flags)
    "sft": ("sft", ["--method", "sft"]),
    "sdft, base teacher": ("sdft_base", ["--method", "sdft", "--teacher_model_kind", "base"]),
    "sdft, EMA teacher (rate 0.05)": ("sdft_ema", ["--method", "sdft", "--teacher_model_kind", "ema"]),
}
ANSWER_TOKENS = 32
GENERAL_PROMPTS = 24


def train(run_dir: Path, flags: list[str], minutes: float) -> dict:
    command = [sys.executable, "-m", "distill", "train", "--output_dir", str(run_dir), "--overwrite_output_dir", "true",
               "--max_time_minutes", str(minutes), *COMMON, *flags]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {"seconds": time.perf_counter() - start, "steps": records[-1]["step"], "epochs": records[-1]["epoch"],
            "final_loss": records[-1]["loss"]}


class Measure:
    """Everything measured on a model: fact accuracy (held-out, training questions) and forgetting."""

    def __init__(self, device: torch.device, questions: int = 0, facts: str = FACTS,
                 templates: tuple[str, ...] = (DEFAULT_TEACHER_PROMPT_TEMPLATE,)):
        self.device, self.templates = device, templates
        self.original, self.tokenizer = load_model(DEFAULT_TEACHER, "model", device)
        self.eos_ids = eos_token_ids(self.tokenizer, self.original)
        self.vocab = student_vocab_size(self.tokenizer, self.original)
        self.encoder = TextRenderer(self.tokenizer, 256, ANSWER_TOKENS, self.eos_ids)
        self.heldout = examples_from_dataset(load_dataset_spec(facts, "heldout", "dataset"), "dataset")
        self.train_questions = examples_from_dataset(load_dataset_spec(facts, "train", "dataset"), "dataset")
        if questions:  # a quick check of the script, not a measurement
            self.heldout, self.train_questions = self.heldout[:questions], self.train_questions[:questions]
        general = examples_from_dataset(load_dataset_spec(BUNDLED_DATASET, "heldout", "dataset"), "dataset")[:GENERAL_PROMPTS]
        # The original model is the teacher; general prompts have no privileged context, so it sees them bare.
        prompts = TeacherPrompts(TextRenderer(self.tokenizer, 512, 48, self.eos_ids), DEFAULT_TEACHER_PROMPT_TEMPLATE)
        self.teacher = SelfTeacher("live", self.original, prompts, self.vocab, self.eos_ids, self.tokenizer.pad_token_id, device)
        self.forgetting = Evaluator(self.teacher, self.tokenizer, TextRenderer(self.tokenizer, 256, 48, self.eos_ids), general,
                                    self.vocab, self.eos_ids, self.tokenizer.pad_token_id, device, EvalSettings(48, 8, 3, 42))

    def accuracy(self, model, examples, with_context: bool = False) -> dict:
        if with_context:
            prompts = [self.teacher.teacher_prompt(e)[0] for e in examples]
        else:
            prompts = [self.encoder.prompt_ids(e.prompt)[0] for e in examples]
        outputs = generate_completions(model, prompts, SamplingParams(1.0, 1.0, 0, ANSWER_TOKENS, do_sample=False),
                                       self.eos_ids, self.tokenizer.pad_token_id, self.device, batch_size=16, vocab_size=self.vocab)
        answers = [self.tokenizer.decode(sample.ids, skip_special_tokens=True) for sample in outputs]
        correct = sum(contains_answer(a, e.answer) for a, e in zip(answers, examples))
        leakage = template_leakage(answers, [e.prompt[-1]["content"] for e in examples], self.templates)
        return {"correct": correct, "questions": len(examples), "accuracy": correct / len(examples),
                "template_leakage": leakage["fraction"], "leak_example": leakage["example"],
                "example": {"question": examples[0].prompt[-1]["content"], "answer": answers[0], "expected": examples[0].answer}}

    def row(self, model) -> dict:
        model.eval()
        with torch.no_grad():
            general = self.forgetting.evaluate(model)
            return {"heldout": self.accuracy(model, self.heldout), "train_questions": self.accuracy(model, self.train_questions),
                    "forgetting_forward_kl": general["on_teacher_completions"]["forward_kl"],
                    "general_answers": general["answers"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=6.0, help="training minutes per arm")
    parser.add_argument("--runs", default="runs/bench_sdft", help="run directories (models: not committed)")
    parser.add_argument("--out", default="benchmarks/results/sdft.json")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--questions", type=int, default=0, help="questions per set (0 = all; fewer only to try the script)")
    args = parser.parse_args()
    torch.manual_seed(0)
    runs = Path(args.runs)
    device = torch.device("cpu")
    measure = Measure(device, args.questions)

    def measure_before() -> dict:
        row = measure.row(measure.original)
        with torch.no_grad():
            row["teacher_with_fact_heldout"] = measure.accuracy(measure.original, measure.heldout, with_context=True)
        return row

    parts: dict = {}
    results = run_arms(runs, ARMS, args.resume, measure_before, lambda run_dir, flags: train(run_dir, flags, args.minutes),
                       lambda run_dir: measure.row(load_model(str(run_dir / "model"), "model", device)[0]), parts)

    header = f"{'':32} {'held-out acc':>12} {'train-q acc':>11} {'forgetting KL':>13} {'steps':>6} {'epochs':>6}"
    print(header)
    for name, row in results.items():
        steps = f"{row['steps']:>6} {row['epochs']:>6.2f}" if "steps" in row else f"{'':>6} {'':>6}"
        print(f"{name:32} {row['heldout']['accuracy']:>12.3f} {row['train_questions']['accuracy']:>11.3f} "
              f"{row['forgetting_forward_kl']:>13.4f} {steps}")
    print(f"self-teacher (original model shown the fact), held-out accuracy: {results['before training']['teacher_with_fact_heldout']['accuracy']:.3f}")
    write_result(args.out, {**parts, "minutes_per_arm": args.minutes, "command": " ".join(sys.argv), "common_flags": COMMON,
                            "arms": {name: flags for name, (_, flags) in ARMS.items()}, "results": results})


if __name__ == "__main__":
    main()
