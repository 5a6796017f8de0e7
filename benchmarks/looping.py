"""Why the default run's greedy answers loop, measured: arms that change one suspect each, as curves.

The bundled default (`distill train`: SmolLM2-135M-Instruct teaches its layer-dropped copy, GKD with teacher
samples for 54 of 72 steps, then half of the micro-batches on-policy) ended with greedy answers like "A concept of
a concept of a concept ..." while it sampled its teacher at temperature 1. The suspects, each an arm that changes
only it (flags on top of that former default, `FORMER`: the arms name it, so they measure the same today):

- greedy decoding of a small student: every checkpoint's answers are measured greedy *and* sampled at
  temperature 1 (the student's own samples, which the on-policy divergences are measured on); a loop that shows
  only greedy is a property of the argmax path, not of the distribution the loss shapes;
- the schedule: on-policy micro-batches from an earlier step (`lmbda_schedule_steps`), the student sampling near
  its greedy path in them (`sampling_temperature 0.3`: the states greedy decoding visits), a constant learning rate
  (the default's cosine leaves little for the on-policy steps at the end);
- the loss: the generalized JSD on the teacher's samples (`off_policy_beta`) instead of forward KL;
- the teacher's samples: at temperature 0.8, 0.7 and 0.5 (`teacher_sampling_temperature`), nearer its greedy path.
  At 0.8 the student's greedy answers loop no more often than the teacher's at nearly the same forward KL: the
  default since;
- defined, not yet run for the results: a combination (constant learning rate, on-policy reverse KL at temperature
  0.3), `lr 1e-4` and `96 new tokens` (the budget: most of the teacher's 48-token completions are cut before their
  end of turn).

Each arm keeps a checkpoint every 18 steps. Every checkpoint (and the student before training, step 0) is
evaluated by the run's own evaluation (`Distiller.evaluator`, the teacher's samples and answers computed once)
on every held-out prompt: forward KL on the teacher's samples (the default's headline), the fraction of answers
that end in a loop (`distill.evaluation.repetition`) greedy and at temperature 1, and distinct-2. The teacher's
own greedy and sampled answers are measured the same way: the bar a student should not exceed. With --decoding, the
default arm's final student and the teacher also answer sampled at temperatures 0.3, 0.5 and 0.7 (`--arms` is every
arm unless named: `--resume --decoding --arms`, with no names, adds only these rows to a finished file).

    python benchmarks/looping.py [--resume] [--arms NAME ...] [--decoding]   # about 14 minutes an arm on 2 CPU cores
Writes benchmarks/results/looping.json and looping.png and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from provenance import provenance, record_part, write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).parent))
from curves import curve, metrics, parse_arm_arguments, train  # noqa: E402  (sibling scripts)

from distill import DistillConfig  # noqa: E402
from distill.evaluation.evaluator import Evaluator  # noqa: E402
from distill.evaluation.repetition import repetition  # noqa: E402
from distill.generation import SamplingParams, generate_completions  # noqa: E402
from distill.generation.seeds import row_seeds  # noqa: E402
from distill.teachers.build import load_model  # noqa: E402
from distill.training.trainer import Distiller  # noqa: E402

RUNS = Path("runs/bench-looping")
CHECKPOINTS = ["--save_steps", "18"]
FORMER_DEFAULT = "former default, teacher samples at 1"
FORMER = ["--teacher_sampling_temperature", "1.0"]  # the default until these arms found 0.7 (each arm below names it)
ARMS = {  # name: (run directory, flags on top of the default)
    FORMER_DEFAULT: ("default", FORMER),
    "on-policy from step 18": ("lmbda_from_18", [*FORMER, "--lmbda_schedule_steps", "18"]),
    "no on-policy (lmbda 0)": ("lmbda_0", [*FORMER, "--lmbda", "0"]),
    "JSD 0.5 on teacher samples": ("off_policy_beta_0.5", [*FORMER, "--off_policy_beta", "0.5"]),
    "lr 1e-4": ("lr_1e-4", [*FORMER, "--learning_rate", "1e-4"]),
    "constant lr after warm-up": ("constant_lr", [*FORMER, "--lr_scheduler_type", "constant_with_warmup"]),
    "student samples at temperature 0.3": ("sampling_temperature_0.3", [*FORMER, "--sampling_temperature", "0.3"]),
    "constant lr, on-policy reverse KL at temperature 0.3": (
        "constant_lr_reverse_t0.3", [*FORMER, "--lr_scheduler_type", "constant_with_warmup", "--sampling_temperature", "0.3",
                                     "--beta", "1"]),
    "96 new tokens": ("new_tokens_96", [*FORMER, "--max_new_tokens", "96"]),
    # Greedy loops live on the student's own near-greedy paths, which neither the teacher's samples nor the student's
    # samples at temperature 1 visit (those loop 0 of 40): on-policy micro-batches sampled near the greedy path.
    "on-policy from step 18 at temperature 0.3": (
        "lmbda_from_18_t0.3", [*FORMER, "--lmbda_schedule_steps", "18", "--sampling_temperature", "0.3"]),
    "constant lr, on-policy from step 18 at temperature 0.3": (
        "constant_lr_lmbda_from_18_t0.3", [*FORMER, "--lr_scheduler_type", "constant_with_warmup",
                                           "--lmbda_schedule_steps", "18", "--sampling_temperature", "0.3"]),
    # The loss moves the loops (JSD 0.5 on teacher samples: 7.5%) at a cost in forward KL that constant lr may pay back.
    "constant lr, JSD 0.2 on teacher samples": (
        "constant_lr_off_policy_beta_0.2", [*FORMER, "--lr_scheduler_type", "constant_with_warmup", "--off_policy_beta",
                                            "0.2"]),
    # The states the student's greedy decoding visits are near the teacher's greedy path; teacher samples at a lower
    # temperature put more of the forward-KL training there (the held-out forward KL stays measured at temperature 1).
    "teacher samples at temperature 0.7": ("teacher_temperature_0.7", ["--teacher_sampling_temperature", "0.7"]),
    "teacher samples at temperature 0.5": ("teacher_temperature_0.5", ["--teacher_sampling_temperature", "0.5"]),
    # Between 0.7 (the teacher's loop rate, 77.2% of the gap) and 1.0 (four times it, 77.9%): the default now (this
    # arm is the default run); and 0.7 with the learning rate held after warm-up (at 1.0 the lowest forward KL of the
    # arms), not run yet. Checkpoints at 36 and 72 only.
    "teacher samples at temperature 0.8": ("teacher_temperature_0.8", ["--teacher_sampling_temperature", "0.8",
                                                                       "--save_steps", "36"]),
    "constant lr, teacher samples at 0.7": ("constant_lr_teacher_temperature_0.7", [
        "--lr_scheduler_type", "constant_with_warmup", "--save_steps", "36"]),
    # The noise of one run: the default (teacher samples at 0.8) with another seed (prompt order, lmbda draws, sampling).
    "default, seed 7": ("default_t0.8_seed_7", ["--seed", "7", "--save_steps", "36"]),
}


def evaluation_row(evaluator: Evaluator, student) -> dict:
    with torch.no_grad():
        result = evaluator.evaluate(student)
    return {"forward_kl": result["on_teacher_completions"]["forward_kl"],
            "own_forward_kl": result["on_student_completions"]["forward_kl"],
            "loop_greedy": result["repetition"]["loop_fraction"], "distinct_2_greedy": result["repetition"]["distinct_2"],
            "loop_sampled": result["sampled_repetition"]["loop_fraction"],
            "loop_example": result["repetition"]["example"], "answers": result["answers"]}


DECODING_TEMPERATURES = (0.3, 0.5, 0.7)


def decoding(distiller: Distiller, evaluator: Evaluator, student) -> dict:
    """The looping fraction of answers sampled at a low temperature, the student's and the teacher's (per-row seeds)."""
    models = {"student": student, "teacher": distiller.teacher.model}
    rows = {}
    for name, model in models.items():
        for temperature in DECODING_TEMPERATURES:
            sampling = SamplingParams(temperature, 1.0, 0, distiller.parts.config.eval_max_new_tokens)
            seeds = row_seeds(len(evaluator.prompts), distiller.parts.config.seed, "looping benchmark")
            with torch.no_grad():
                outputs = generate_completions(model, evaluator.prompts, sampling, distiller.parts.eos_ids, distiller.parts.pad_id,
                                               torch.device("cpu"), 8, vocab_size=distiller.parts.vocab_size, seeds=seeds)
            rows[f"{name}, temperature {temperature}"] = repetition([evaluator.decode(sample.ids) for sample in outputs])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval_max_prompts", type=int, default=0, help="held-out prompts measured (0: all 40)")
    parser.add_argument("--decoding", action="store_true", help="also: the default arm's final student and the teacher "
                        "sampled at low temperatures (needs that arm finished)")
    args = parse_arm_arguments(parser, ARMS, str(Path(__file__).parent / "results" / "looping.json"))
    out = Path(args.out)
    results = json.loads(out.read_text()) if args.resume and out.is_file() else {}
    start = time.perf_counter()
    # The default's evaluation, built as a run builds it (nothing written): the teacher, the held-out prompts.
    distiller = Distiller(DistillConfig(output_dir=str(RUNS / "evaluator"), eval_max_prompts=args.eval_max_prompts,
                                        progress_bar=False))
    evaluator = distiller.evaluator()
    assert evaluator is not None
    if "teacher" not in results:
        results["teacher"] = {"greedy": evaluator.teacher_repetition(), "sampled": evaluator.teacher_sampled_repetition(),
                              "prompts": len(evaluator.prompts)}
        results["before training"] = evaluation_row(evaluator, distiller.student_model)
        results["measuring_seconds_per_checkpoint"] = time.perf_counter() - start
        for part in ("teacher", "before training"):
            record_part(results, part, [provenance()])
    results.setdefault("arms", {})
    for name in args.arms:
        directory, flags = ARMS[name]
        run_dir = RUNS / directory
        trained = train(run_dir, flags if "--save_steps" in flags else [*flags, *CHECKPOINTS], args.resume)
        rows = curve(run_dir, lambda student: evaluation_row(evaluator, load_model(str(student), "model",
                                                                                   torch.device("cpu"))[0]), args.resume)
        training = {record["step"]: record for record in metrics(run_dir)}
        for row in rows:
            row["clipped_ratio"] = training[row["step"]].get("clipped_ratio")
        results["arms"][name] = {"flags": flags, "seconds": trained["seconds"], "curve": rows}
        record_part(results, f"arms/{name}", trained.get("provenance"))
        write_result(out, results)
    if args.decoding and "decoding" not in results:
        student = load_model(str(RUNS / ARMS[FORMER_DEFAULT][0] / "model"), "model", torch.device("cpu"))[0]
        results["decoding"] = decoding(distiller, evaluator, student)
        record_part(results, "decoding", [provenance()])
    results["summary"] = summary(results)
    write_result(out, results)
    print_table(results)
    plot(results, out.with_suffix(".png"))


def summary(results: dict) -> list[dict]:
    """One row per arm at its last checkpoint (and the teacher, and the student before training): what the docs show."""
    teacher = results["teacher"]
    rows = [{"arm": "teacher", "loop_greedy": teacher["greedy"]["loop_fraction"],
             "loop_sampled": teacher["sampled"]["loop_fraction"], "distinct_2_greedy": teacher["greedy"]["distinct_2"]},
            {"arm": "before training", "step": 0, **{k: v for k, v in results["before training"].items()
                                                      if k not in ("answers", "loop_example")}}]
    for name, arm in results["arms"].items():
        last = arm["curve"][-1]
        rows.append({"arm": name, "flags": " ".join(arm["flags"]), "minutes": arm["seconds"] / 60,
                     **{k: v for k, v in last.items() if k not in ("answers", "loop_example", "seconds")}})
    return rows


def print_table(results: dict) -> None:
    teacher = results["teacher"]
    print(f"teacher: looping {teacher['greedy']['loop_fraction']:.3f} greedy, {teacher['sampled']['loop_fraction']:.3f} "
          f"sampled, over {teacher['prompts']} held-out prompts")
    print(f"{'arm':32} {'step':>4} {'fwd KL':>7} {'loop greedy':>11} {'loop T1':>8} {'distinct-2':>10} {'minutes':>7}")
    before = results["before training"]
    print(f"{'before training':32} {0:>4} {before['forward_kl']:7.3f} {before['loop_greedy']:11.3f} "
          f"{before['loop_sampled']:8.3f} {before['distinct_2_greedy']:10.3f}")
    for name, arm in results["arms"].items():
        for row in arm["curve"]:
            print(f"{name:32} {row['step']:>4} {row['forward_kl']:7.3f} {row['loop_greedy']:11.3f} {row['loop_sampled']:8.3f} "
                  f"{row['distinct_2_greedy']:10.3f} {row['seconds'] / 60:7.1f}")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    panels = [("forward_kl", "held-out forward KL on teacher samples"), ("loop_greedy", "greedy answers that loop"),
              ("loop_sampled", "answers sampled at T 1 that loop")]
    before = results["before training"]
    for axis, (key, title) in zip(axes, panels):
        for index, (name, arm) in enumerate(results["arms"].items()):
            steps = [0] + [row["step"] for row in arm["curve"]]
            axis.plot(steps, [before[key]] + [row[key] for row in arm["curve"]], marker="o", color=f"C{index}", label=name)
        teacher = {"loop_greedy": results["teacher"]["greedy"]["loop_fraction"],
                   "loop_sampled": results["teacher"]["sampled"]["loop_fraction"]}.get(key)
        if teacher is not None:
            axis.axhline(teacher, color="#555", linestyle="--", label="teacher")
        axis.set_title(title)
        axis.set_xlabel("optimizer step")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
