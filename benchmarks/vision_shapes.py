"""Vision-language distillation on a synthetic visual task written for the project: coloured shapes.

Each image (56 x 56, one filled square, circle or triangle in red, green, blue or yellow, at a random place and
size) comes with one of two questions: "What colour is the shape?" or "Which shape is it?", answered in one word.
A tiny Qwen2-VL teacher (4 layers, hidden 64, random init) learns the task with `sft` (vision tower trained too);
then a smaller student (2 layers, hidden 32, random init, its own vision tower trained) learns it three ways on
the same rows and steps: `sft` on the dataset's answers, `gkd` with lmbda 0 (the teacher's distribution over the
dataset's answers), `gkd` with lmbda 0.5 (half its micro-batches the student's own samples) and `on_policy` (the
teacher's distribution over the student's own samples only), and `on_policy` again from the sft arm's student
after a third of the steps (a warm start, as the GKD paper starts from a supervised student). Measured: held-out
accuracy (the greedy answer contains the right word; 96 held-out images) against steps and wall time, every few
steps from the checkpoints.

    python benchmarks/vision_shapes.py                 # ~15 minutes on 2 cores
    python benchmarks/vision_shapes.py --resume        # reuse finished runs (work folder: runs/bench-vision)

Writes benchmarks/results/vision_shapes.json and .png.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

from provenance import record_part, write_result  # a sibling script: the result with its environment

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from curves import curve, train  # noqa: E402  (sibling script)

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("square", "circle", "triangle")
HELD_OUT = 96
QUESTIONS = {"colour": "What colour is the shape?", "shape": "Which shape is it?"}


def make_task(directory: Path, rows: int, seed: int) -> Path:
    """A JSON Lines file of `rows` questions about drawn shapes, the PNGs in `directory/images`."""
    from tests.models.vision.models import shape_image

    rng = random.Random(seed)
    (directory / "images").mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(rows):
        colour, shape, kind = rng.choice(COLOURS), rng.choice(SHAPES), rng.choice(tuple(QUESTIONS))
        size = rng.randint(24, 44)
        left, top = rng.randint(2, 54 - size), rng.randint(2, 54 - size)
        name = f"images/{i}.png"
        shape_image(colour, shape, box=(left, top, left + size, top + size)).save(directory / name)
        answer = colour if kind == "colour" else shape
        lines.append({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTIONS[kind]}]}],
                      "images": [name], "completion": answer, "answer": answer})
    path = directory / "shapes.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def save_models(work: Path) -> dict[str, Path]:
    from tests.models.vision.models import qwen_processor, tiny_qwen_vl

    dirs = {}
    for name, layers, hidden, seed in (("teacher-init", 4, 64, 1), ("student-init", 2, 32, 2)):
        path = work / name
        if not (path / "config.json").is_file():
            processor = qwen_processor()
            tiny_qwen_vl(processor.tokenizer, layers=layers, seed=seed, hidden=hidden).save_pretrained(path)
            processor.tokenizer.save_pretrained(path)
            processor.image_processor.save_pretrained(path)
        dirs[name] = path
    return dirs


def accuracy(model_dir: Path, held_out: Path) -> dict:
    """Greedy answers of the model on the held-out rows: the fraction that contain the right word, per question."""
    import datasets
    import torch

    from distill.data import examples_from_dataset
    from distill.generation import SamplingParams, generate_completions
    from distill.models.kinds import model_kind_of
    from distill.tasks.answers import contains_answer
    from distill.teachers.build import load_model

    model, tokenizer = load_model(str(model_dir), "student")
    examples = examples_from_dataset(datasets.load_dataset("json", data_files=str(held_out), split="train"), "held_out",
                                     held_out.parent)
    encoder = model_kind_of(model).encoder(tokenizer, 64, 8, [tokenizer.eos_token_id], model)
    encoded = [encoder.row(e) for e in examples]
    out = generate_completions(model, [e.prompt_ids for e in encoded], SamplingParams(1.0, 1.0, 0, 8, do_sample=False),
                               [tokenizer.eos_token_id], tokenizer.pad_token_id, torch.device("cpu"), batch_size=16,
                               extras=[e.extras for e in encoded])
    right: dict[str, list[bool]] = {kind: [] for kind in QUESTIONS}
    for example, sample in zip(examples, out):
        assert example.answer is not None, "every easy-vqa question has its one-word answer"
        kind = "colour" if example.answer in COLOURS else "shape"
        right[kind].append(contains_answer(tokenizer.decode(sample.ids, skip_special_tokens=True), example.answer))
    every = [r for rows in right.values() for r in rows]
    return {"accuracy": sum(every) / len(every), **{f"accuracy_{k}": sum(v) / len(v) for k, v in right.items() if v}}


COMMON = ["--max_prompt_length", "64", "--max_new_tokens", "8", "--per_device_train_batch_size", "8",
          "--gradient_accumulation_steps", "1", "--lr_scheduler_type", "constant", "--warmup_steps", "0", "--seed", "0",
          "--train_vision_tower", "true", "--student_init", "all"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-vision")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "vision_shapes.json")
    parser.add_argument("--train-rows", type=int, default=2000)
    parser.add_argument("--teacher-steps", type=int, default=1500)
    parser.add_argument("--teacher-lr", type=float, default=2e-3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="checkpoint (and measure) every this many steps")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    started = time.time()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    data, held_out = make_task(work / "train", args.train_rows, seed=0), make_task(work / "held_out", HELD_OUT, seed=1)
    dirs = save_models(work)

    teacher_run = work / "teacher"
    if not (args.resume and (teacher_run / "model" / "config.json").is_file()):
        train(teacher_run, ["--method", "sft", "--student", str(dirs["teacher-init"]), "--dataset", str(data), "--max_steps",
                            str(args.teacher_steps), "--learning_rate", str(args.teacher_lr), "--save_steps", "0", *COMMON],
              resume=False)
    teacher = teacher_run / "model"
    teacher_record = json.loads((teacher_run / "train.json").read_text()) if (teacher_run / "train.json").is_file() else {}
    result = {"task": {"train_rows": args.train_rows, "held_out_rows": HELD_OUT, "colours": COLOURS, "shapes": SHAPES},
              "teacher": {"layers": 4, "hidden": 64, "sft_steps": args.teacher_steps, "learning_rate": args.teacher_lr, **accuracy(teacher, held_out)},
              "student": {"layers": 2, "hidden": 32}, "steps": args.steps, "arms": {}}
    record_part(result, "teacher", teacher_record.get("provenance"))
    print(f"teacher after {args.teacher_steps} sft steps: accuracy {result['teacher']['accuracy']:.3f}", flush=True)
    arms = {"sft": ["--method", "sft"],
            "gkd (lmbda 0)": ["--method", "gkd", "--teacher", str(teacher), "--lmbda", "0", "--lmbda_schedule", "constant", "--seq_kd", "false"],
            "gkd (lmbda 0.5)": ["--method", "gkd", "--teacher", str(teacher), "--lmbda", "0.5", "--lmbda_schedule", "constant",
                                "--seq_kd", "false"],
            "on_policy": ["--method", "on_policy", "--teacher", str(teacher)]}
    # The last arm starts on-policy from the sft arm's checkpoint at `warm` steps (kept for it): on-policy
    # distillation from a student that already answers, as the GKD paper starts from a supervised student.
    warm = args.steps // 3
    arms[f"on_policy after {warm} sft steps"] = ["--method", "on_policy", "--teacher", str(teacher)]
    start = {"step": 0, "seconds": 0.0, **accuracy(dirs["student-init"], held_out)}
    for name, flags in arms.items():
        run_dir = work / name.replace(" ", "").replace("(", "-").replace(")", "")
        warm_start = name.startswith("on_policy after")
        origin = work / "sft" / "warm-start" if warm_start else dirs["student-init"]
        record = train(run_dir, [*flags, "--student", str(origin), "--dataset", str(data), "--max_steps",
                                 str(args.steps - warm if warm_start else args.steps), "--learning_rate", "1e-3",
                                 "--save_steps", str(args.every), *COMMON], resume=args.resume)
        if name == "sft" and not (work / "sft" / "warm-start").is_dir():
            shutil.copytree(work / "sft" / "checkpoints" / f"step-{warm:06d}" / "student", work / "sft" / "warm-start")
        rows = curve(run_dir, lambda student: accuracy(student, held_out), resume=args.resume)
        if warm_start:  # steps and seconds continue the sft arm's
            sft_rows = result["arms"]["sft"]["curve"]
            before = next(r for r in sft_rows if r["step"] == warm)
            rows = [{**r, "step": r["step"] + warm, "seconds": r["seconds"] + before["seconds"]} for r in rows]
            head = [r for r in sft_rows if r["step"] <= warm]
        else:
            head = [start]
        # A warm start's training time counts the sft steps it started from.
        seconds = record["seconds"] + (head[-1]["seconds"] if warm_start else 0.0)
        result["arms"][name] = {"train_seconds": seconds, "curve": [*head, *rows]}
        record_part(result, f"arms/{name}", record.get("provenance"))
        print(f"{name:>14}: " + ", ".join(f"step {r['step']} {r['accuracy']:.2f}" for r in [*head, *rows]), flush=True)
    result["wall_minutes"] = (time.time() - started) / 60
    write_result(args.out, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"wrote {args.out} ({result['wall_minutes']:.1f} minutes)")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(10, 4))
    for name, arm in result["arms"].items():
        steps = [r["step"] for r in arm["curve"]]
        seconds = [r["seconds"] for r in arm["curve"]]
        accuracy_ = [r["accuracy"] for r in arm["curve"]]
        by_step.plot(steps, accuracy_, marker="o", label=name)
        by_time.plot(seconds, accuracy_, marker="o", label=name)
    for axis in (by_step, by_time):
        axis.axhline(result["teacher"]["accuracy"], color="grey", linestyle="--", label="teacher")
        axis.set_ylabel("held-out accuracy")
        axis.set_ylim(0, 1.05)
    by_step.set_xlabel("optimizer steps")
    by_time.set_xlabel("wall seconds (training)")
    by_step.legend()
    figure.suptitle("Coloured shapes: a 2-layer Qwen2-VL student from a 4-layer teacher")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
