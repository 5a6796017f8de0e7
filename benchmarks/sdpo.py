"""RL on checkable answers: GRPO vs SDPO (pure and blended) at an equal number of generated completions, on CPU.

SmolLM2-135M-Instruct (the default model) is the policy. The bundled arithmetic task (`bundled:arithmetic`:
"What is a + b? Answer with the number only.", 300 training and 100 held-out sums) is the task; the reward
is 1 when the completion holds the answer as a whole word (`contains_answer`). Every arm trains the same
number of optimizer steps with the same groups (so the same number of sampled completions), then is
measured in this process on the held-out sums:

- greedy accuracy: the greedy answer contains the sum;
- sampled pass@1: the fraction of --samples completions per prompt at temperature 1 that contain it;
- the training reward curve (reward/mean per logged step, the sampled accuracy on training prompts).

    python benchmarks/sdpo.py --steps 40 [--resume]
Writes benchmarks/results/sdpo.json and benchmarks/results/sdpo_rewards.png and prints a table. Runs are
sequential (one at a time on the machine); --resume keeps the arms of an earlier invocation that finished.
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
from distill.data_files import load_dataset_spec
from distill.generation import SamplingParams, generate_completions
from distill.models import DEFAULT_TEACHER, eos_token_ids, student_vocab_size
from distill.rendering import TextRenderer
from distill.tasks.answers import contains_answer
from distill.teachers.build import load_model

TASK = "bundled:arithmetic"
MAX_NEW_TOKENS = 16
COMMON = ["--method", "sdpo", "--dataset", TASK, "--reward_funcs", "contains_answer", "--num_generations", "8",
          "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "4", "--max_new_tokens", str(MAX_NEW_TOKENS),
          "--learning_rate", "2e-5", "--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "3",
          "--save_steps", "0", "--progress_bar", "false", "--eval_before_after", "false", "--logging_steps", "2"]
ARMS = {  # name: (run directory, flags)
    "GRPO (distillation_weight 0)": ("grpo", ["--distillation_weight", "0", "--loss_type", "grpo"]),
    "SDPO (distillation_weight 1)": ("sdpo", ["--distillation_weight", "1"]),
    "SDPO blend (distillation_weight 0.5)": ("sdpo_blend", ["--distillation_weight", "0.5", "--loss_type", "grpo"]),
}


def train(run_dir: Path, flags: list[str], steps: int) -> dict:
    command = [sys.executable, "-m", "distill", "train", "--output_dir", str(run_dir), "--overwrite_output_dir", "true",
               "--max_steps", str(steps), *COMMON, *flags]
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [{"step": r["step"], "reward": r["reward/mean"], "reprompt_fraction": r.get("sdpo/reprompt_sample_fraction"),
              "completion_tokens": r.get("sdpo/completion_tokens"), "distilled_tokens": r.get("sdpo/distilled_tokens"),
              "distillation_loss": r.get("sdpo/distillation_loss")}
             for r in records if "reward/mean" in r]
    return {"seconds": time.perf_counter() - start, "steps": records[-1]["step"], "curve": curve,
            "completions": steps * 8 * 4}


class Measure:
    """Held-out accuracy of a model: greedy, and sampled pass@1 over `samples` completions per prompt."""

    def __init__(self, device: torch.device, samples: int, prompts: int = 0):
        self.device, self.samples = device, samples
        self.original, self.tokenizer = load_model(DEFAULT_TEACHER, "model", device)
        self.eos_ids = eos_token_ids(self.tokenizer, self.original)
        self.vocab = student_vocab_size(self.tokenizer, self.original)
        self.encoder = TextRenderer(self.tokenizer, 128, MAX_NEW_TOKENS, self.eos_ids)
        self.heldout = examples_from_dataset(load_dataset_spec(TASK, "heldout", "dataset"), "dataset")
        if prompts:  # a quick check of the script, not a measurement
            self.heldout = self.heldout[:prompts]
        self.answers = [e.answer for e in self.heldout if e.answer is not None]
        assert len(self.answers) == len(self.heldout), f"{TASK}: every held-out row has the answer to check"

    def _correct(self, model, sampling: SamplingParams, repeats: int) -> tuple[int, int, str]:
        prompts = [self.encoder.prompt_ids(e.prompt)[0] for e in self.heldout for _ in range(repeats)]
        outputs = generate_completions(model, prompts, sampling, self.eos_ids, self.tokenizer.pad_token_id, self.device,
                                       batch_size=50, vocab_size=self.vocab)
        answers = [self.tokenizer.decode(sample.ids, skip_special_tokens=True) for sample in outputs]
        expected = [answer for answer in self.answers for _ in range(repeats)]
        return sum(contains_answer(a, x) for a, x in zip(answers, expected)), len(answers), answers[0]

    def row(self, model) -> dict:
        model.eval()
        torch.manual_seed(1234)  # every model is sampled with the same generator state
        with torch.no_grad():
            greedy, n, example = self._correct(model, SamplingParams(1.0, 1.0, 0, MAX_NEW_TOKENS, do_sample=False), 1)
            sampled, m, _ = self._correct(model, SamplingParams(1.0, 1.0, 0, MAX_NEW_TOKENS), self.samples)
        first = self.heldout[0].prompt
        question = first if isinstance(first, str) else first[-1]["content"]
        return {"greedy_accuracy": greedy / n, "sampled_pass_at_1": sampled / m, "prompts": n, "samples": m,
                "example": {"question": question, "answer": example,
                            "expected": self.heldout[0].answer}}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, row in results.items():
        if "curve" in row:
            axis.plot([p["step"] for p in row["curve"]], [p["reward"] for p in row["curve"]], marker="o", markersize=3, label=name)
    before = results["before training"]["sampled_pass_at_1"]
    axis.axhline(before, color="grey", linestyle="--", linewidth=1, label="before training (held-out pass@1)")
    axis.set_xlabel("optimizer step (32 sampled completions each)")
    axis.set_ylabel("training reward (sampled accuracy)")
    axis.set_title("bundled:arithmetic, SmolLM2-135M-Instruct")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per arm (32 completions each)")
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per held-out prompt (pass@1)")
    parser.add_argument("--runs", default="runs/bench_sdpo", help="run directories (models: not committed)")
    parser.add_argument("--out", default="benchmarks/results/sdpo.json")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--prompts", type=int, default=0, help="held-out prompts (0 = all; fewer only to try the script)")
    args = parser.parse_args()
    runs = Path(args.runs)
    device = torch.device("cpu")
    measure = Measure(device, args.samples, args.prompts)

    parts: dict = {}
    results = run_arms(runs, ARMS, args.resume, lambda: measure.row(measure.original),
                       lambda run_dir, flags: train(run_dir, flags, args.steps),
                       lambda run_dir: measure.row(load_model(str(run_dir / "model"), "model", device)[0]), parts)

    print(f"{'':38} {'greedy acc':>10} {'pass@1':>7} {'reward first':>12} {'reward last':>11} {'minutes':>7}")
    for name, row in results.items():
        curve = row.get("curve")
        rewards = f"{curve[0]['reward']:>12.3f} {curve[-1]['reward']:>11.3f}" if curve else f"{'':>12} {'':>11}"
        minutes = f"{row['seconds'] / 60:>7.1f}" if "seconds" in row else f"{'':>7}"
        print(f"{name:38} {row['greedy_accuracy']:>10.3f} {row['sampled_pass_at_1']:>7.3f} {rewards} {minutes}")
    out = Path(args.out)
    plot(results, out.with_name("sdpo_rewards.png"))
    write_result(out, {**parts, "steps_per_arm": args.steps, "command": " ".join(sys.argv), "common_flags": COMMON,
                       "arms": {name: flags for name, (_, flags) in ARMS.items()}, "results": results})


if __name__ == "__main__":
    main()
