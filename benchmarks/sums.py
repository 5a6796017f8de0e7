"""Learning the bundled sums from rewards or from a teacher: GRPO, SDPO (with and without environment
feedback), and on-policy distillation from the GRPO-trained model, as curves against sampled tokens.

SmolLM2-135M-Instruct (the default model) starts every arm. The task is `bundled:arithmetic` ("What is
a + b? Answer with the number only.", 300 training and 100 held-out sums, reward 1 when the completion
holds the sum as a whole word). Arms, run one after the other:

- GRPO: `distill train sdpo --distillation_weight 0 --loss_type grpo` (benchmarks/sdpo.py's settings: 4
  prompts x 8 samples per step, lr 2e-5, 16 new tokens). Its final model is the teacher below.
- SDPO: the same groups, pure self-distillation (a failed sample's self-teacher is re-prompted with a
  successful sibling); SDPO + feedback adds the row's `feedback` column to the re-prompt: a hint that is
  not the answer ("the answer is an even number larger than 20"), written by this script.
- on-policy distillation (the field's OPD): `distill train on_policy --beta 1` (reverse KL on the student's
  samples, full vocabulary) with the GRPO model as the teacher, 8 prompts x 1 sample per step; and
  `iw_opd` (sampled-token policy gradient with prefix-decayed weights) with the same teacher and batch; both
  at lr 5e-5 and at 1e-5.
- seed repeats (the noise): on-policy distillation (at both learning rates) and GRPO again with seed 1, drawn
  in their arm's colour.

Each arm keeps a checkpoint every few steps; each checkpoint is measured on the held-out sums (greedy
accuracy, and pass@1 over --samples completions per prompt at temperature 1), and placed by the sampled
completion tokens spent up to it (the student's own samples; the teacher's scoring is not sampling) and by
wall time. The field's claim (on-policy distillation reaches an RL-trained teacher's accuracy at a fraction
of RL's sampling) holds here if the distillation arms reach the GRPO model's accuracy with several times
fewer sampled tokens than its GRPO run spent. Training curves (success fraction, completions cut at the
token limit) come from metrics.jsonl.

    python benchmarks/sums.py [--resume] [--arms NAME ...]
Writes benchmarks/results/sums.json and sums.png and prints a table.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Callable

import torch
from provenance import record_part, write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from arms import made_once  # noqa: E402  (sibling scripts)
from curves import curve, measuring_seconds, metrics, parse_arm_arguments, train  # noqa: E402
from sdpo import MAX_NEW_TOKENS, TASK, Measure  # noqa: E402

from distill.data_files import load_dataset_spec
from distill.models import DEFAULT_TEACHER
from distill.tasks.answers import contains_answer
from distill.teachers.build import load_model

RUNS = Path("runs/bench_sums")
TEACHER_ARM = "GRPO (the teacher's run)"
TEACHER = RUNS / "grpo" / "model"
FEEDBACK_DATA = RUNS / "arithmetic_feedback.jsonl"
SHARED = ["--max_new_tokens", str(MAX_NEW_TOKENS), "--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "3"]
GROUPS = ["--reward_funcs", "contains_answer", "--num_generations", "8", "--per_device_train_batch_size", "8",
          "--gradient_accumulation_steps", "4", "--learning_rate", "2e-5", "--max_steps", "40"]
DISTILL = ["--teacher", str(TEACHER), "--student", DEFAULT_TEACHER, "--student_init", "all", "--dataset", TASK,
           "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "1", "--max_steps", "60"]
LR = ["--learning_rate", "5e-5"]  # the distillation arms' learning rate, unless the arm names another
ON_POLICY = ["--method", "on_policy", "--beta", "1", *DISTILL]  # the field's OPD: reverse KL on the student's samples
ARMS = {  # name: (run directory, flags, completions sampled per step)
    "GRPO (the teacher's run)": ("grpo", ["--method", "sdpo", "--dataset", TASK, *GROUPS, "--distillation_weight", "0",
                                          "--loss_type", "grpo", "--save_steps", "5"], 32),
    "on-policy distillation (reverse KL)": ("on_policy", [*ON_POLICY, *LR, "--save_steps", "15"], 8),
    "iw_opd": ("iw_opd", ["--method", "iw_opd", *DISTILL, *LR, "--save_steps", "15"], 8),
    "iw_opd, lr 1e-5": ("iw_opd_1e-5", ["--method", "iw_opd", *DISTILL, "--learning_rate", "1e-5", "--save_steps", "15"], 8),
    "on-policy distillation, lr 1e-5": ("on_policy_1e-5", [*ON_POLICY, "--learning_rate", "1e-5", "--save_steps", "15"], 8),
    "on-policy distillation, lr 1e-5, seed 1": ("on_policy_1e-5_seed1", [*ON_POLICY, "--learning_rate", "1e-5",
                                                                         "--save_steps", "15", "--seed", "1"], 8),
    "SDPO": ("sdpo", ["--method", "sdpo", "--dataset", TASK, *GROUPS, "--distillation_weight", "1", "--save_steps", "20"], 32),
    "SDPO + feedback": ("sdpo_feedback", ["--method", "sdpo", "--dataset", str(FEEDBACK_DATA), *GROUPS,
                                          "--distillation_weight", "1", "--include_feedback", "true", "--save_steps", "20"], 32),
    "on-policy distillation, seed 1": ("on_policy_seed1", [*ON_POLICY, *LR, "--save_steps", "15", "--seed", "1"], 8),
    "GRPO, seed 1": ("grpo_seed1", ["--method", "sdpo", "--dataset", TASK, *GROUPS, "--distillation_weight", "0",
                                    "--loss_type", "grpo", "--save_steps", "20", "--seed", "1"], 32),
}


def hint(a: int, b: int) -> str:
    """A hint that narrows the sum without giving it: its parity and a lower bound."""
    parity = "even" if (a + b) % 2 == 0 else "odd"
    return f"The answer is an {parity} number larger than {max(a, b)}."


def write_feedback_data(path: Path) -> None:
    rows = [dict(row) for split in ("train", "heldout") for row in load_dataset_spec(TASK, split, "dataset")]
    for row in rows:
        row["feedback"] = hint(row["a"], row["b"])
        assert not contains_answer(row["feedback"], row["answer"]), row  # a hint, never the answer
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def training_curve(run_dir: Path, completions_per_step: int) -> list[dict]:
    """Per logged step: sampled completion tokens so far, training success fraction, completions cut at the limit."""
    rows, spent = [], 0.0
    for record in metrics(run_dir):
        spent += record["completion_length/student"] * completions_per_step
        rows.append({"step": record["step"], "sampled_tokens": spent, "clipped_ratio": record.get("clipped_ratio"),
                     "reward": record.get("reward/mean"), "reprompt_fraction": record.get("sdpo/reprompt_sample_fraction"),
                     "feedback_fraction": record.get("sdpo/feedback_fraction"), "reverse_kl": record.get("reverse_kl")})
    return rows


def run_arm(name: str, directory: str, flags: list[str], per_step: int, measure: Callable[[], Measure], resume: bool) -> dict:
    run_dir = RUNS / directory
    flags = [*flags, *SHARED]
    trained = train(run_dir, flags, resume)
    measured = curve(run_dir, lambda student: measure().row(load_model(str(student), "model", torch.device("cpu"))[0]), resume)
    training = training_curve(run_dir, per_step)
    tokens = {row["step"]: row["sampled_tokens"] for row in training}
    for point in measured:
        point["sampled_tokens"] = tokens[point["step"]]
    return {"flags": flags, "completions_per_step": per_step, "seconds": trained["seconds"],
            "measuring_seconds": measuring_seconds(run_dir), "curve": measured, "provenance": trained.get("provenance"),
            "training": training}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = results["before training"]
    bases = [name for name in results if ", seed " not in name]
    variants = {name: next(base for base in bases if base.startswith(name.rsplit(", seed ", 1)[0]))
                for name in results if ", seed " in name}  # "on-policy distillation, seed 1" -> "... (reverse KL)"
    colour = {name: f"C{i}" for i, name in enumerate(n for n in results if n not in variants)}
    colour.update({name: colour[base] for name, base in variants.items()})  # a seed repeat in its arm's colour
    style = {name: "-" for name in results}
    style.update({name: "--" for name in variants})
    figure, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    tokens, minutes = "sampled completion tokens", "wall minutes (2 CPU cores)"
    held_out = [(axes[0][0], "sampled_tokens", "greedy_accuracy", tokens, "held-out greedy accuracy"),
                (axes[0][1], "sampled_tokens", "sampled_pass_at_1", tokens, "held-out pass@1 (T 1)"),
                (axes[0][2], "minutes", "sampled_pass_at_1", minutes, "held-out pass@1 (T 1)"),
                (axes[1][2], "minutes", "greedy_accuracy", minutes, "held-out greedy accuracy")]
    for axis, x, y, xlabel, ylabel in held_out:
        for name, row in results.items():
            if "curve" in row:
                points = [{**p, "minutes": p["seconds"] / 60} for p in row["curve"]]
                axis.plot([0] + [p[x] for p in points], [before[y]] + [p[y] for p in points], marker="o", markersize=3,
                          label=name, color=colour[name], linestyle=style[name])
        axis.set_xlabel(xlabel)
        axis.set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    training = [(axes[1][0], "reward", "training success fraction (5-step mean)"),
                (axes[1][1], "clipped_ratio", f"training completions cut at {MAX_NEW_TOKENS} tokens (5-step mean)")]
    for axis, y, ylabel in training:
        for name, row in results.items():
            if "training" in row and row["training"][0][y] is not None:
                values = [p[y] for p in row["training"]]
                smooth = [sum(values[max(0, i - 4) : i + 1]) / len(values[max(0, i - 4) : i + 1]) for i in range(len(values))]
                axis.plot([p["sampled_tokens"] for p in row["training"]], smooth, linewidth=1, label=name, color=colour[name],
                          linestyle=style[name])
        axis.set_xlabel(tokens)
        axis.set_ylabel(ylabel)
    axes[1][0].legend(fontsize=7)
    figure.suptitle("bundled:arithmetic, SmolLM2-135M-Instruct: RL, self-distillation and on-policy distillation")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def tokens_to_reach(row: dict, target: float, key: str) -> float | None:
    """Sampled tokens at the first measured checkpoint whose `key` reaches `target` (None: never)."""
    return next((p["sampled_tokens"] for p in row["curve"] if p[key] >= target), None)


def summary(results: dict) -> list[dict]:
    """One flat row per arm for the docs: its last checkpoint; the sampled tokens it spent until a checkpoint
    first reached the teacher's held-out pass@1 (the GRPO run's last checkpoint), and until one reached 0.9 of
    it (which the noisy GRPO curve itself reaches before its end), each also as a share of the GRPO run's
    tokens to the same mark; its training success and cut-off fractions over the last 5 steps (and, for the
    distillation arms, the reverse KL to the teacher on their own samples over the first and last 5 steps)."""
    teacher_run = results[TEACHER_ARM]
    marks = {"teacher": teacher_run["curve"][-1]["sampled_pass_at_1"]}
    marks["nine_tenths_teacher"] = 0.9 * marks["teacher"]
    grpo_tokens = {mark: tokens_to_reach(teacher_run, value, "sampled_pass_at_1") for mark, value in marks.items()}
    rows = []
    for name, row in results.items():
        if "curve" not in row:
            rows.append({"arm": name, "steps": 0, "sampled_tokens": 0, "greedy_accuracy": row["greedy_accuracy"],
                         "sampled_pass_at_1": row["sampled_pass_at_1"]})
            continue
        last, tail = row["curve"][-1], row["training"][-5:]
        summary_row = {"arm": name, "steps": last["step"], "completions": last["step"] * row["completions_per_step"],
                       "sampled_tokens": last["sampled_tokens"], "minutes": row["seconds"] / 60,
                       "greedy_accuracy": last["greedy_accuracy"], "sampled_pass_at_1": last["sampled_pass_at_1"],
                       "best_sampled_pass_at_1": max(p["sampled_pass_at_1"] for p in row["curve"]),
                       "training_success_last5": None if tail[0]["reward"] is None
                       else sum(p["reward"] for p in tail) / len(tail),
                       "clipped_ratio_last5": sum(p["clipped_ratio"] for p in tail) / len(tail)}
        if row["training"][0]["reverse_kl"] is not None:  # the distillation arms: KL(student || teacher) on their samples
            head = row["training"][:5]
            summary_row["reverse_kl_first5"] = sum(p["reverse_kl"] for p in head) / len(head)
            summary_row["reverse_kl_last5"] = sum(p["reverse_kl"] for p in tail) / len(tail)
        for mark, value in marks.items():
            tokens = tokens_to_reach(row, value, "sampled_pass_at_1")
            summary_row[f"tokens_to_{mark}_pass_at_1"] = tokens
            grpo = grpo_tokens[mark]
            summary_row[f"share_of_grpo_tokens_to_{mark}_pass_at_1"] = None if tokens is None or grpo is None else tokens / grpo
        rows.append(summary_row)
    return rows


def points(results: dict) -> list[dict]:
    """Every measured checkpoint as a flat row (the docs' curve table)."""
    return [{"arm": name, "step": p["step"], "sampled_tokens": p["sampled_tokens"], "minutes": p["seconds"] / 60,
             "greedy_accuracy": p["greedy_accuracy"], "sampled_pass_at_1": p["sampled_pass_at_1"]}
            for name, row in results.items() if "curve" in row for p in row["curve"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=4, help="sampled completions per held-out prompt (pass@1)")
    args = parse_arm_arguments(parser, ARMS, "benchmarks/results/sums.json")
    write_feedback_data(FEEDBACK_DATA)
    measure = functools.cache(lambda: Measure(torch.device("cpu"), args.samples))  # loaded only if something is measured
    parts: dict = {}
    RUNS.mkdir(parents=True, exist_ok=True)
    results = {"before training": made_once(RUNS / "before.json", args.resume, lambda: measure().row(measure().original),
                                            parts, "before training")}
    for name in args.arms:
        directory, flags, per_step = ARMS[name]
        results[name] = run_arm(name, directory, flags, per_step, measure, args.resume)
        record_part(parts, f"results/{name}", results[name].pop("provenance"))

    if TEACHER_ARM not in results:
        parser.error(f"the arms compare against {TEACHER_ARM!r}: include it (with --resume it is not re-run)")
    rows = summary(results)
    print(f"{'':40} {'steps':>5} {'tokens':>7} {'greedy':>6} {'pass@1':>6} {'minutes':>7}  tokens to the teacher's pass@1")
    for row in rows:
        reach = row.get("tokens_to_teacher_pass_at_1")
        print(f"{row['arm']:40} {row['steps']:>5} {row['sampled_tokens']:>7.0f} {row['greedy_accuracy']:>6.3f} "
              f"{row['sampled_pass_at_1']:>6.3f} {row.get('minutes', 0):>7.1f}  {'' if reach is None else f'{reach:.0f}'}")
    out = Path(args.out)
    plot(results, out.with_suffix(".png"))
    wall = sum(row["seconds"] + row["measuring_seconds"] for row in results.values() if "seconds" in row)
    write_result(out, {**parts, "command": " ".join(sys.argv), "wall_minutes": wall / 60,
                       "samples_per_prompt": args.samples, "summary": rows,
                       "points": points(results), "results": results})


if __name__ == "__main__":
    main()
