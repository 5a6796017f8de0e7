"""Learning new facts without forgetting, as a frontier: sft and sdft at several learning rates and budgets
(held-out accuracy against forgetting, one point per checkpoint), and what removes sdft's template leak.

SmolLM2-135M-Instruct (the default model) is the student. The task is the first FACTS facts of
`bundled:facts` (one training question per fact, two held-out paraphrases each), written to a file by
this script: the full set (168 facts) needs more epochs than two CPU cores give in a session, and a
method needs tens of epochs over its facts to learn them (see the docs). Each arm trains 10 prompts per
step with a constant learning rate after 5 warm-up steps, keeping a checkpoint every --every steps, so
the checkpoint at step s is the s-step run of that learning rate. Every checkpoint is measured:

- new knowledge: greedy answers to the held-out paraphrases that contain the answer string;
- forgetting: forward KL(original model || student) on the original model's samples of 24 bundled general
  held-out prompts (the evaluation of `distill train`, with the original model as the teacher);
- template leakage: the fraction of held-out answers repeating 5 or more words of the teacher template
  that the question does not hold (`distill.evaluation.leakage`).

The paper's claim (SDFT, arXiv 2601.19897): sdft's frontier dominates sft's, more new knowledge at the
same forgetting. The leak arms change one thing each from sdft: the first tokens' loss skipped, another
template (the fact before the question), the top-k loss instead of the full vocabulary. They run twice:
from lr 1e-4 to step 40 (a checkpoint of every other arm too), and from lr 3e-4, the arm that learns, to
its last step (does the lever keep the learning?). Two arms repeat another with seed 1 (the noise): sdft
at lr 1e-4 to step 40, and sft at lr 3e-5, which learns.

    python benchmarks/sdft_frontier.py [--resume] [--arms NAME ...]
Writes benchmarks/results/sdft_frontier.json and sdft_frontier.png and prints a table.
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
from sdft import Measure  # noqa: E402

from distill.data_files import load_dataset_spec
from distill.methods.self_teacher_prompts import DEFAULT_TEACHER_PROMPT_TEMPLATE
from distill.teachers.build import load_model

FACTS = 20
RUNS = Path("runs/bench_frontier")
DATA = RUNS / f"facts{FACTS}.jsonl"
LEAK_STEP = 40  # the leak arms' last step, a checkpoint of every other arm too
FACT_FIRST_TEMPLATE = "Use this fact to answer the question.\nFact: {privileged_context}\n\n{prompt}"
COMMON = ["--dataset", str(DATA), "--per_device_train_batch_size", "10", "--gradient_accumulation_steps", "1",
          "--max_new_tokens", "32", "--lr_scheduler_type", "constant_with_warmup", "--warmup_steps", "5"]
SDFT = ["--method", "sdft", "--teacher_model_kind", "ema"]
ARMS = {  # name: (run directory, flags, steps, checkpoint every)
    "sft, lr 1e-5": ("sft_1e-5", ["--method", "sft", "--learning_rate", "1e-5"], 60, 20),
    "sft, lr 3e-5": ("sft_3e-5", ["--method", "sft", "--learning_rate", "3e-5"], 60, 20),
    "sft, lr 1e-4": ("sft_1e-4", ["--method", "sft", "--learning_rate", "1e-4"], 60, 20),
    "sdft, lr 1e-4": ("sdft_1e-4", [*SDFT, "--learning_rate", "1e-4"], 60, 20),
    "sdft, lr 3e-4": ("sdft_3e-4", [*SDFT, "--learning_rate", "3e-4"], 60, 20),
    "sdft, lr 1e-4, first 4 tokens skipped": ("sdft_skip4", [*SDFT, "--learning_rate", "1e-4",
                                                             "--num_loss_tokens_to_skip", "4"], LEAK_STEP, LEAK_STEP),
    "sdft, lr 1e-4, fact-first template": ("sdft_fact_first", [*SDFT, "--learning_rate", "1e-4", "--teacher_prompt_template",
                                                               FACT_FIRST_TEMPLATE], LEAK_STEP, LEAK_STEP),
    "sdft, lr 1e-4, top-20 loss": ("sdft_top20", [*SDFT, "--learning_rate", "1e-4", "--distillation_mode", "topk_logits",
                                                  "--distillation_topk", "20"], LEAK_STEP, LEAK_STEP),
    "sdft, lr 1e-4, seed 1": ("sdft_1e-4_seed1", [*SDFT, "--learning_rate", "1e-4", "--seed", "1"], LEAK_STEP, LEAK_STEP),
    "sdft, lr 3e-4, first 4 tokens skipped": ("sdft_3e-4_skip4", [*SDFT, "--learning_rate", "3e-4",
                                                                  "--num_loss_tokens_to_skip", "4"], 60, 20),
    "sdft, lr 3e-4, fact-first template": ("sdft_3e-4_fact_first", [*SDFT, "--learning_rate", "3e-4",
                                                                    "--teacher_prompt_template", FACT_FIRST_TEMPLATE], 60, 20),
    "sdft, lr 3e-4, top-20 loss": ("sdft_3e-4_top20", [*SDFT, "--learning_rate", "3e-4", "--distillation_mode", "topk_logits",
                                                       "--distillation_topk", "20"], 60, 20),
    "sft, lr 3e-5, seed 1": ("sft_3e-5_seed1", ["--method", "sft", "--learning_rate", "3e-5", "--seed", "1"], 60, 20),
}
LEARNING_ARM = "sdft, lr 3e-4"  # the sdft arm that learns: the levers again, on it, to its last step
LEARNING_STEP = 60


def write_subset(path: Path) -> None:
    rows = [dict(row) for split in ("train", "heldout") for row in load_dataset_spec("bundled:facts", split, "dataset")
            if row["fact_id"] < FACTS]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def run_arm(directory: str, flags: list[str], steps: int, every: int, measure: Callable[[], Measure], resume: bool) -> dict:
    run_dir = RUNS / directory
    flags = [*COMMON, *flags, "--max_steps", str(steps), "--save_steps", str(every)]
    trained = train(run_dir, flags, resume)
    measured = curve(run_dir, lambda student: measure().row(load_model(str(student), "model", torch.device("cpu"))[0]), resume)
    losses = [{"step": r["step"], "loss": r["loss"]} for r in metrics(run_dir)]
    return {"flags": flags, "seconds": trained["seconds"], "measuring_seconds": measuring_seconds(run_dir),
            "curve": measured, "provenance": trained.get("provenance"), "loss": losses}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    before = results["before training"]
    figure, (frontier, leak) = plt.subplots(1, 2, figsize=(13, 5))
    for name, row in results.items():
        if "curve" not in row:
            continue
        points = [before] + row["curve"]
        style = "--" if name.count(",") > 1 else "-"  # the leak and seed arms dashed
        frontier.plot([p["forgetting_forward_kl"] for p in points], [p["heldout"]["accuracy"] for p in points], style,
                      marker="o" if name.startswith("sdft") else "s", markersize=4, label=name)
        leak.plot([p.get("step", 0) for p in points], [p["heldout"]["template_leakage"] for p in points], style,
                  marker="o", markersize=3, label=name)
    frontier.set_xlabel("forgetting: forward KL(original || student) on general prompts")
    frontier.set_ylabel("held-out paraphrase accuracy")
    frontier.set_title("one point per checkpoint, from step 0")
    frontier.legend(fontsize=7)
    leak.set_xlabel("optimizer step")
    leak.set_ylabel("held-out answers repeating the teacher template")
    figure.suptitle(f"{FACTS} invented facts, SmolLM2-135M-Instruct: sft vs sdft (EMA self-teacher)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def points(results: dict) -> list[dict]:
    """Every measured checkpoint as a flat row (the model before training as step 0 of every arm's method)."""
    before = results["before training"]
    rows = []
    for name, row in results.items():
        if "curve" not in row:
            continue
        for point in [{**before, "step": 0, "seconds": 0.0}] + row["curve"]:
            rows.append({"arm": name, "method": name.split(",")[0], "step": point["step"], "minutes": point["seconds"] / 60,
                         "heldout_accuracy": point["heldout"]["accuracy"], "forgetting": point["forgetting_forward_kl"],
                         "template_leakage": point["heldout"]["template_leakage"],
                         "leak_example": point["heldout"]["leak_example"]})
    return rows


def frontier(rows: list[dict], method: str) -> list[dict]:
    """The method's points no other point of it beats on both axes (more accuracy, less forgetting), by forgetting."""
    mine = [r for r in rows if r["method"] == method]
    return sorted((r for r in mine if not any(dominates(o, r) for o in mine)), key=lambda r: r["forgetting"])


def dominates(a: dict, b: dict) -> bool:
    return (a["heldout_accuracy"] >= b["heldout_accuracy"] and a["forgetting"] <= b["forgetting"]
            and (a["heldout_accuracy"], a["forgetting"]) != (b["heldout_accuracy"], b["forgetting"]))


def best_at_most(rows: list[dict], method: str, forgetting: float) -> float:
    """The method's best held-out accuracy among its points that forgot no more than `forgetting`."""
    return max((r["heldout_accuracy"] for r in rows if r["method"] == method and r["forgetting"] <= forgetting), default=0.0)


def compare(rows: list[dict]) -> list[dict]:
    """At each frontier point of either method: the other method's best accuracy at no more forgetting."""
    out = []
    for method, other in (("sdft", "sft"), ("sft", "sdft")):
        for point in frontier(rows, method):
            if point["step"] == 0:
                continue
            out.append({"arm": point["arm"], "step": point["step"], "forgetting": point["forgetting"],
                        "heldout_accuracy": point["heldout_accuracy"], "template_leakage": point["template_leakage"],
                        "other": other, "other_best_at_no_more_forgetting": best_at_most(rows, other, point["forgetting"])})
    return out


def seed_repeats(rows: list[dict]) -> list[dict]:
    """Each "..., seed 1" arm beside the seed-0 arm it repeats, at every step both measured: the noise."""
    out = []
    for repeat in {r["arm"] for r in rows if r["arm"].endswith(", seed 1")}:
        original = repeat.removesuffix(", seed 1")
        first = {r["step"]: r for r in rows if r["arm"] == original}
        for row in sorted((r for r in rows if r["arm"] == repeat and r["step"] > 0), key=lambda r: r["step"]):
            if row["step"] in first:
                seed0 = first[row["step"]]
                out.append({"arm": original, "step": row["step"],
                            **{f"{key}_seed{seed}": r[key] for seed, r in ((0, seed0), (1, row))
                               for key in ("heldout_accuracy", "forgetting", "template_leakage")},
                            "heldout_accuracy_difference": row["heldout_accuracy"] - seed0["heldout_accuracy"]})
    return sorted(out, key=lambda r: (r["arm"], r["step"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    args = parse_arm_arguments(parser, ARMS, "benchmarks/results/sdft_frontier.json")
    torch.manual_seed(0)
    write_subset(DATA)
    measure = functools.cache(lambda: Measure(torch.device("cpu"), facts=str(DATA),  # loaded only if something is measured
                                              templates=(DEFAULT_TEACHER_PROMPT_TEMPLATE, FACT_FIRST_TEMPLATE)))
    def measure_before() -> dict:
        row = measure().row(measure().original)
        with torch.no_grad():
            row["teacher_with_fact_heldout"] = measure().accuracy(measure().original, measure().heldout, with_context=True)
        return row

    parts: dict = {}
    RUNS.mkdir(parents=True, exist_ok=True)
    results = {"before training": made_once(RUNS / "before.json", args.resume, measure_before, parts, "before training")}
    for name in args.arms:
        directory, flags, steps, every = ARMS[name]
        results[name] = run_arm(directory, flags, steps, every, measure, args.resume)
        record_part(parts, f"results/{name}", results[name].pop("provenance"))

    rows = points(results)
    print(f"{'':40} {'step':>4} {'held-out':>8} {'forgetting KL':>13} {'leak':>5} {'minutes':>7}")
    for row in rows:
        print(f"{row['arm']:40} {row['step']:>4} {row['heldout_accuracy']:>8.3f} {row['forgetting']:>13.4f} "
              f"{row['template_leakage']:>5.2f} {row['minutes']:>7.1f}")
    matched = compare(rows)
    print("\nfrontier points, and the other method's best held-out accuracy at no more forgetting:")
    for row in matched:
        print(f"{row['arm']:40} {row['step']:>4} {row['heldout_accuracy']:>8.3f} {row['forgetting']:>13.4f}   "
              f"{row['other']}: {row['other_best_at_no_more_forgetting']:.3f}")
    out = Path(args.out)
    plot(results, out.with_suffix(".png"))
    final = [max((r for r in rows if r["arm"] == name), key=lambda r: r["step"]) for name in results if name in ARMS]
    wall = sum(row["seconds"] + row["measuring_seconds"] for row in results.values() if "seconds" in row)
    write_result(out, {**parts, "command": " ".join(sys.argv), "wall_minutes": wall / 60, "facts": FACTS,
                       "final_points": final, "points": rows, "frontier_comparison": matched,
                       "at_leak_step": [r for r in rows if r["step"] == LEAK_STEP],
                       "levers_where_sdft_learns": [r for r in rows if r["arm"].startswith(LEARNING_ARM)
                                                    and r["step"] == LEARNING_STEP],
                       "seed_repeats": seed_repeats(rows),
                       "results": results})


if __name__ == "__main__":
    main()
