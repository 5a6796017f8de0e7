"""Distilling function calling on BFCL, as curves against steps, wall time and sampled tokens.

The questions: the Berkeley Function Calling Leaderboard's `simple_python` and `multiple` (`distill.tasks.bfcl`), split
by function: no function a training row offers is offered by a held-out row (450 train rows, 150 held out). The rows
are written first when DATA/bfcl.jsonl is missing: `python -m distill.tasks.bfcl --out DATA --tools-in-prompt` (the
schemas in the system message, the reference call as the completion's text, so every method samples on them).

Arms, one after the other:

- teacher: SmolLM2-135M-Instruct (the default model) with `sft` on the train split, as the recipe bfcl_teacher.yaml
  trains it (learning rate 1e-4, 4 rows x 2 micro-batches a step, --steps steps); always seed 0, shared by both
  students. For the full student its curve is also plain sft on the reference calls.
- the student (`--student`): `full`, the untuned default model (a competent model that lacks the skill: it answers in
  prose), or `dropped`, the layer-dropped one (student_init drop_every:3, 20 of 30 layers).
- sft_teacher: offline distillation. The teacher samples as many answers as the sampling arms below sample (--steps x
  4 x 2), cycling over the train prompts, at seq_kd's teacher sampling settings (temperature 0.8), one seed per answer
  and --seed; they are written as rows {id, prompt, completion} (answers cut by the token budget, or empty, left out:
  "dropped") and the student is trained on them with `sft` for the same steps.
- on_policy: the student's own answers, scored by the teacher (the method's default loss, JSD at beta 0.5).
- on_policy_forward_kl: the same at beta 0, the forward KL, whose gradient at a token the student is sure of and the
  teacher rules out does not vanish (an answer begun in prose where the teacher calls; `benchmarks/decision_token.py`
  measures such a token on the chain task, where only this loss took on-policy distillation off 0%).
- gkd: as the recipe bfcl.yaml: the teacher's sampled answers for the first three quarters of the steps, then the
  student's own in half the micro-batches (lmbda 0.5 from step 45 of 60).
- grpo: no teacher: method sdpo at distillation_weight 0 (GRPO, loss_type grpo), reward
  distill.tasks.bfcl.scoring:calls_reward (1 when the answer's calls are right by BFCL's rules); num_generations 4, so
  a step samples the same 8 answers as the other arms (2 questions x 4): the smallest group whose advantages mean
  something, and a CPU step no longer than theirs.

Every arm keeps a checkpoint every --every steps; each, and the untrained student (step 0), is measured on the
held-out questions (all of them, or the first --heldout): greedy answers (128 new tokens), scored by distill's BFCL
scorer (`accuracy`, `errors` by BFCL's error type, `cut_rate`: answers that hit the token budget). The answers are
saved as {"id", "text"} lines, RUNS/.../<arm>/answers/<checkpoint>.jsonl, which `scripts/bfcl_official_check.sh` reads;
`--official` runs it on every saved answer file without a report (never installing BFCL's environment: a message when
it is missing), and each row then carries `official`: BFCL's own accuracy, distill's, and how often they agree. Each
row gives the tokens sampled through its step (student's and teacher's answers, from the run's metrics.jsonl;
sft_teacher's are the teacher's answers it trained on, spread evenly over its steps, its wall time includes their
sampling) and the wall time at its checkpoint; grpo's rows also `rewarded_answers`, how many of its sampled answers
through that step were right (with none, GRPO has no gradient); and where the run logged them, `grad_norm_mean` and
`forward_kl_mean`, the mean gradient norm and the teacher's KL to the student per sampled token over the steps since
the previous checkpoint (whether the loss still moved the student, and how far its answers were from the teacher's).

Time, alone on two CPU cores: 60 steps of on_policy_forward_kl 47 minutes, of sft_teacher 30 (its 480 teacher answers
sampled in 7.5 of those); one measure of the 150 held-out questions about 2.5 minutes (over 5 beside other work); all
arms of one student and seed, 5 to 7 hours.

    python benchmarks/bfcl.py [--steps 60] [--every 20] [--student full|dropped] [--seed N] [--arms NAME ...]
                              [--resume] [--official] [--heldout N] [--runs DIR] [--data DIR] [--doctor]
Writes benchmarks/results/bfcl.json (the full student; the dropped one: bfcl_dropped.json) and its .png and prints a
table. `--steps N` other than 60 gives the student arms a budget of their own: their runs RUNS/.../ARM_Nsteps and the
result file bfcl_Nsteps.json (bfcl_dropped_Nsteps.json), while the teacher stays the one 60-step teacher (with --resume
and the arm `teacher` listed, its trained run is reused and its curve copied in). `--seed N` (N > 0, with --resume)
repeats the student arms with training seed N into `repeats`; `final` gives each arm's last checkpoint with its
accuracy for every seed measured; `paired` compares every two arms' last checkpoints (seed 0) question by question
(how many only one answers right, and McNemar's exact p-value), from `right_at_final` (each such checkpoint's right and
wrong answers, kept so that a later invocation without the earlier runs' answers on disk can still compare them);
`repeats_paired` and `repeats_right_at_final` do the same for each repeated seed (its arms and the teacher, which is
trained once). `--doctor` runs `distill doctor` on each arm's command line instead (it loads the models and times a
step, writes nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch
from provenance import provenance, record_part, write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentic import STUDENTS  # noqa: E402  (sibling scripts)
from curves import (  # noqa: E402
    CHECKPOINT_FLAGS,
    curve,
    final_rows,
    parse_arm_arguments,
    plot_curves,
    train,
    with_rewarded_answers,
    with_sampled_tokens,
    with_teacher_sampling,
    with_training_signal,
)

from distill.config import DistillConfig
from distill.generation import SamplingParams, generate_completions
from distill.models import DEFAULT_TEACHER, eos_token_ids, make_student, student_vocab_size
from distill.rendering import TextRenderer
from distill.seeds import row_seed
from distill.tasks.bfcl.scoring import evaluate_calls
from distill.teachers.build import load_model

OFFICIAL_CHECK = Path(__file__).resolve().parents[1] / "scripts" / "bfcl_official_check.sh"
NOT_INSTALLED = 3  # bfcl_official_check.sh's exit status under BFCL_INSTALL=0 when BFCL's environment is missing
BATCH, ACCUMULATION = 4, 2  # rows per micro-batch, micro-batches per step: 8 answers sampled a step
MAX_PROMPT_LENGTH, MAX_NEW_TOKENS = 1024, 128  # bfcl_teacher.yaml's: the longest prompt is 898 tokens
MEASURE_BATCH = 16  # held-out prompts decoded together, sorted by length (less padding)
DEVICE = torch.device("cpu")
GREEDY = SamplingParams(1.0, 1.0, 0, MAX_NEW_TOKENS, do_sample=False)
_DEFAULTS = DistillConfig()  # the teacher samples as seq_kd's teacher does (gkd's teacher-sampled answers)
TEACHER_SAMPLING = SamplingParams(_DEFAULTS.teacher_sampling_temperature, _DEFAULTS.teacher_top_p,
                                  _DEFAULTS.teacher_top_k, MAX_NEW_TOKENS)
# STUDENTS (agentic.py's): `full` trains at learning rate 5e-5, not the recipes' 3e-4 (the layer-dropped student's): a
# whole pretrained student drifts on its own samples at 3e-4, and `distill doctor` warns above 2e-5. Every arm of a
# student takes the same rate, so that the arms differ only in what they train on.
RESULTS = {"full": "benchmarks/results/bfcl.json", "dropped": "benchmarks/results/bfcl_dropped.json"}
STEPS, EVERY = 60, 20  # the default budget; the teacher is always trained with it, so every budget shares one teacher


def needs_teacher(name: str, flags: list[str]) -> bool:
    """Whether arm `name` reads the trained teacher: every arm that scores with it (--teacher), and sft_teacher, which
    trains on its sampled answers."""
    return name == "sft_teacher" or "--teacher" in flags


def arms(data: Path, runs: Path, steps: int, every: int, student: str, seed: int) -> dict[str, list[str]]:
    """Each arm's `distill train` flags (CHECKPOINT_FLAGS and --output_dir added by `curves.train`)."""
    budget = ["--max_steps", str(steps), "--save_steps", str(every)]
    teacher_budget = ["--max_steps", str(STEPS), "--save_steps", str(EVERY)]
    shape = ["--max_prompt_length", str(MAX_PROMPT_LENGTH), "--max_new_tokens", str(MAX_NEW_TOKENS),
             "--per_device_train_batch_size", str(BATCH), "--gradient_accumulation_steps", str(ACCUMULATION)]
    rows = ["--dataset", str(data / "bfcl.jsonl"), "--dataset_split", "train", *shape]
    teacher, chosen = ["--teacher", str(runs / "teacher" / "model")], STUDENTS[student]
    return {
        "teacher": ["--method", "sft", "--student", DEFAULT_TEACHER, "--learning_rate", "1e-4", *teacher_budget, *rows],
        "sft_teacher": ["--method", "sft", *chosen, *budget, "--dataset", str(teacher_answers_path(runs, steps, seed)),
                        *shape],
        "on_policy": ["--method", "on_policy", *teacher, *chosen, *budget, *rows],
        "on_policy_forward_kl": ["--method", "on_policy", "--beta", "0", *teacher, *chosen, *budget, *rows],
        "gkd": ["--method", "gkd", *teacher, *chosen, *budget, *rows, "--lmbda_schedule_steps", str(3 * steps // 4)],
        "grpo": ["--method", "sdpo", "--distillation_weight", "0", "--loss_type", "grpo", "--reward_funcs",
                 "distill.tasks.bfcl.scoring:calls_reward", "--num_generations", "4", *chosen, *budget, *rows],
    }


def run_dir(runs: Path, name: str, student: str, seed: int, steps: int = STEPS) -> Path:
    """An arm's run: RUNS/teacher, or RUNS/STUDENT[/seedN]/NAME, with `_STEPSsteps` for a budget other than STEPS."""
    if name == "teacher":
        return runs / "teacher"
    arm = name if steps == STEPS else f"{name}_{steps}steps"
    return runs / student / f"seed{seed}" / arm if seed else runs / student / arm


def results_path(student: str, steps: int) -> str:
    """The result file of `student`'s arms at `steps` steps: RESULTS[student], with `_STEPSsteps` for another budget."""
    default = RESULTS[student]
    return default if steps == STEPS else default.replace(".json", f"_{steps}steps.json")


def teacher_answers_path(runs: Path, steps: int, seed: int) -> Path:
    """The teacher's sampled answers sft_teacher trains on: one file per seed and count, shared by both students."""
    return runs / "teacher_answers" / f"seed{seed}_{steps * BATCH * ACCUMULATION}.jsonl"


def read_rows(data: Path, split: str) -> list[dict]:
    rows = [json.loads(line) for line in (data / "bfcl.jsonl").read_text().splitlines() if line.strip()]
    return [row for row in rows if row["split"] == split]


def check_rows(data: Path, write: bool) -> None:
    """The BFCL rows with the tools in the prompt (the sampling methods refuse a `tools` column without tools to run),
    written first when missing and `write`."""
    path = data / "bfcl.jsonl"
    if not path.is_file() and not write:
        raise SystemExit(f"{path} is missing: `python -m distill.tasks.bfcl --out {data} --tools-in-prompt` writes it "
                         "(a run of this benchmark does)")
    if not path.is_file():
        subprocess.run([sys.executable, "-m", "distill.tasks.bfcl", "--out", str(data), "--tools-in-prompt"], check=True)
    if "tools" in json.loads(path.read_text().split("\n", 1)[0]):
        raise SystemExit(f"{path} has a `tools` column; write it with `python -m distill.tasks.bfcl --out {data} "
                         "--tools-in-prompt`, which the sampling arms need")


def answer(model, tokenizer, prompts: list[list[dict]], sampling: SamplingParams, seeds: list[int] | None = None):
    """One `Sample` per chat prompt, in order: decoded in batches of similar length; `seeds` (one per prompt): each
    drawn from its own generator, whatever its batch (`seeded_rows`)."""
    eos = eos_token_ids(tokenizer, model)
    renderer = TextRenderer(tokenizer, MAX_PROMPT_LENGTH, MAX_NEW_TOKENS, eos)
    ids = [renderer.prompt_ids(prompt)[0] for prompt in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    with torch.no_grad():
        samples = generate_completions(model, [ids[i] for i in order], sampling, eos, tokenizer.pad_token_id, DEVICE,
                                       MEASURE_BATCH, vocab_size=student_vocab_size(tokenizer, model),
                                       seeds=None if seeds is None else [seeds[i] for i in order],
                                       seeded_rows=seeds is not None)
    by_prompt = dict(zip(order, samples))
    return [by_prompt[i] for i in range(len(ids))]


def measure(rows: list[dict], model, tokenizer, answers: Path) -> dict:
    """Greedy answers to `rows`, scored by distill's BFCL scorer and saved as {"id", "text"} lines at `answers` (an
    official report beside them from earlier answers is removed)."""
    start = time.time()
    samples = answer(model, tokenizer, [row["prompt"] for row in rows], GREEDY)
    texts = [tokenizer.decode(s.ids, skip_special_tokens=True).strip() for s in samples]  # as the evaluator reads them
    scored = evaluate_calls(rows, texts)
    assert scored is not None, "BFCL rows carry a `bfcl` column"
    summary, per_row = scored
    answers.parent.mkdir(parents=True, exist_ok=True)
    answers.write_text("".join(json.dumps({"id": r["id"], "text": r["text"]}, ensure_ascii=False) + "\n" for r in per_row))
    official_report(answers).unlink(missing_ok=True)
    return {**summary, "calls_per_answer": sum(len(r["calls"] or []) for r in per_row) / len(per_row),
            "cut_rate": sum(s.hit_max for s in samples) / len(samples), "measure_seconds": time.time() - start,
            "answers": str(answers), "example": texts[0]}


def measure_checkpoint(rows: list[dict], answers_dir: Path, student_dir: Path) -> dict:
    """`measure` of a checkpoint's student (RUN/checkpoints/<checkpoint>/student): answers_dir/<checkpoint>.jsonl."""
    model, tokenizer = load_model(str(student_dir), "student", DEVICE)
    return measure(rows, model, tokenizer, answers_dir / f"{student_dir.parent.name}.jsonl")


def measure_untrained(rows: list[dict], student: str, answers: Path) -> dict:
    """The student before training: the default model, with the layers its student_init keeps."""
    model, tokenizer = load_model(DEFAULT_TEACHER, "student", DEVICE)
    flags = STUDENTS[student]
    init = flags[flags.index("--student_init") + 1] if "--student_init" in flags else "all"
    return measure(rows, make_student(model, init), tokenizer, answers)


def write_teacher_answers(teacher: Path, rows: list[dict], path: Path, count: int, seed: int) -> dict:
    """The teacher's sampled answers to the train prompts (cycled to `count`) as sft rows, and what sampling took
    (written beside them as .json: "teacher_tokens", every sampled answer's; "dropped": those cut by the budget or
    empty; "accuracy": how many are right by BFCL's rules)."""
    start = time.time()
    picked = [rows[i % len(rows)] for i in range(count)]
    model, tokenizer = load_model(str(teacher), "student", DEVICE)
    samples = answer(model, tokenizer, [row["prompt"] for row in picked], TEACHER_SAMPLING,
                     [row_seed(seed, "bfcl teacher answers", k) for k in range(count)])
    texts = [tokenizer.decode(s.ids, skip_special_tokens=True) for s in samples]
    kept = [{"id": row["id"], "prompt": row["prompt"], "completion": text}
            for row, text, sample in zip(picked, texts, samples) if not sample.hit_max and text.strip()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept))
    scored = evaluate_calls(picked, [text.strip() for text in texts])
    record = {"answers": count, "dropped": count - len(kept), "teacher_tokens": sum(len(s.ids) for s in samples),
              "accuracy": scored[0]["accuracy"] if scored else None, "seconds": time.time() - start,
              "temperature": TEACHER_SAMPLING.temperature, "seed": seed}
    path.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def right_by_question(rows: list[dict], answers: Path) -> list[bool]:
    """Whether each of `rows` (in order) is answered right in the saved {"id", "text"} lines `answers`."""
    texts = {line["id"]: line["text"] for line in map(json.loads, answers.read_text().splitlines())}
    scored = evaluate_calls(rows, [texts[row["id"]] for row in rows])
    assert scored is not None, "BFCL rows carry a `bfcl` column"
    return [bool(row["valid"]) for row in scored[1]]


def right_at_final(final: dict[str, dict], rows: list[dict], recorded: dict[str, dict]) -> dict[str, dict]:
    """Each arm's last checkpoint, question by question: {"answers": its answers file, "right": "0110..." (held-out
    order, 1 = right)}, scored from the answers where they are on disk, else kept as `recorded` for the same file
    (measured on a machine whose runs/ are gone); an arm with neither is left out, and named."""
    right = {}
    for name, row in final.items():
        answers = Path(row["answers"])
        if answers.is_file():
            right[name] = {"answers": str(answers), "right": "".join("01"[ok] for ok in right_by_question(rows, answers))}
        elif recorded.get(name, {}).get("answers") == str(answers):
            right[name] = recorded[name]
        else:
            print(f"paired: {name} left out, its answers {answers} are not on disk and were not recorded", flush=True)
    return right


def last_rows_of_seed(results: dict, seed: str) -> dict[str, dict]:
    """The last checkpoint's row of each arm trained with seed `seed` (> 0, `results["repeats"]`), and the teacher's:
    it is trained once (seed 0), and every seed's students learn from it."""
    teacher = {"teacher": results["arms"]["teacher"][-1]} if "teacher" in results["arms"] else {}
    return teacher | {name: arm["rows"][-1] for name, arm in results["repeats"][seed].items()}


def paired(right: dict[str, dict], recorded: dict[str, dict]) -> dict[str, dict]:
    """Every two arms' last checkpoints of one seed on the same held-out questions (`right_at_final`): how many each
    alone answers right, both, and McNemar's exact p-value (the chance of a split of the questions only one answers at
    least as uneven, were each equally likely to be either's): "A vs B" -> {"only_A", "only_B", "both", "p_value"}.
    A pair of which one arm is missing from `right` keeps its `recorded` comparison."""
    names = list(dict.fromkeys([*right, *(name for pair in recorded for name in pair.split(" vs "))]))
    compared = {}
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            key = f"{first} vs {second}"
            if first not in right or second not in right:
                earlier = recorded.get(key) or recorded.get(f"{second} vs {first}")
                if earlier:
                    compared[key] = earlier
                continue
            a, b = ([c == "1" for c in right[name]["right"]] for name in (first, second))
            only_first = sum(x and not y for x, y in zip(a, b))
            only_second = sum(y and not x for x, y in zip(a, b))
            compared[key] = {f"only_{first}": only_first, f"only_{second}": only_second,
                             "both": sum(x and y for x, y in zip(a, b)), "p_value": mcnemar_p_value(only_first, only_second)}
    return compared


def mcnemar_p_value(only_first: int, only_second: int) -> float:
    """McNemar's exact two-sided p-value: twice the binomial(n, 1/2) tail at the smaller count, n the questions only
    one of two arms answers right (at most 1; 1 when there are none)."""
    discordant = only_first + only_second
    tail = sum(math.comb(discordant, k) for k in range(min(only_first, only_second) + 1)) / 2**discordant
    return min(1.0, 2 * tail)


def official_report(answers: Path) -> Path:
    return answers.with_suffix(".bfcl_agreement.json")


class Official:
    """BFCL's own checker beside distill's on saved answers: `scripts/bfcl_official_check.sh`'s report, read where
    there is one, else made when `run` and BFCL's environment is installed (BFCL_INSTALL=0: it is never installed
    here; when it is missing, a message once and no more tries)."""

    KEYS = ("bfcl_accuracy", "distill_accuracy", "agreement", "same_calls", "same_calls_agreement")

    def __init__(self, run: bool):
        self.run = run

    def scores(self, answers: Path) -> dict | None:
        report = official_report(answers)
        if not report.is_file() and self.run:
            environment = {**os.environ, "BFCL_INSTALL": "0", "BFCL_REPORT": str(report.resolve())}
            done = subprocess.run(["bash", str(OFFICIAL_CHECK), str(answers.resolve())], env=environment,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if done.returncode == NOT_INSTALLED:
                print(f"--official: skipped, BFCL's own checker is not installed. {done.stderr.strip()}", flush=True)
                self.run = False
            elif done.returncode:
                raise SystemExit(f"--official: {OFFICIAL_CHECK.name} failed on {answers}:\n{done.stderr}")
        if not report.is_file():
            return None
        found = json.loads(report.read_text())
        return {key: found[key] for key in self.KEYS} | {"disagreements": len(found["disagreements"]), "report": str(report)}

    def rows(self, rows: list[dict]) -> list[dict]:
        """`rows` with "official" where their answers have (or now get) a report. A row whose answers are no longer
        on disk (measured on another machine, runs/ not kept) keeps the "official" it was recorded with."""
        return [{**row, **({"official": found} if (found := self.scores(Path(row["answers"]))) else {})}
                if Path(row["answers"]).is_file() else row for row in rows]


def doctor(table: dict[str, list[str]], names: list[str], runs: Path, student: str, seed: int, steps: int) -> int:
    """`distill doctor` on each arm's command line (as `curves.train` runs it): 1 when any would not start."""
    failed = []
    for name in names:
        flags = [*table[name], *CHECKPOINT_FLAGS]
        if name == "sft_teacher" and not Path(flags[flags.index("--dataset") + 1]).is_file():
            print("(sft_teacher trains on the teacher's answers, which the arm samples first: not written yet)")
        print(f"== {name}: distill doctor {' '.join(flags)}", flush=True)
        done = subprocess.run([sys.executable, "-m", "distill", "doctor", "--output_dir",
                               str(run_dir(runs, name, student, seed, steps)), *flags])
        failed += [name] if done.returncode else []
    print(f"doctor: {len(names) - len(failed)} of {len(names)} arms would start" + (f"; not {failed}" if failed else ""))
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=STEPS, help="the student arms' steps (the teacher's: always 60)")
    parser.add_argument("--every", type=int, default=EVERY, help="the student arms' steps between checkpoints")
    parser.add_argument("--student", choices=list(RESULTS), default="full")
    parser.add_argument("--seed", type=int, default=0, help="the student arms' training seed (the teacher's is 0)")
    parser.add_argument("--heldout", type=int, default=0, help="measure the first N held-out questions (0: all 150)")
    parser.add_argument("--official", action="store_true", help="score saved answers with BFCL's own checker too")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench_bfcl"), help="run directories (not committed)")
    parser.add_argument("--data", type=Path, default=Path("data/bfcl"), help="the rows (written when missing)")
    parser.add_argument("--doctor", action="store_true", help="only check each arm's command line with distill doctor")
    known = parser.parse_known_args()[0]
    student = known.student
    args = parse_arm_arguments(parser, arms(Path(), Path(), STEPS, EVERY, student, 0), results_path(student, known.steps))
    runs, data = args.runs, args.data
    check_rows(data, write=not args.doctor)
    table = arms(data, runs, args.steps, args.every, student, args.seed)
    if args.doctor:
        return doctor(table, args.arms, runs, student, args.seed, args.steps)
    held_out = read_rows(data, "heldout")[: args.heldout or None]
    out = Path(args.out)
    results = json.loads(out.read_text()) if args.resume and out.is_file() else {"arms": {}, "seconds": {}}
    results.update(steps=args.steps, every=args.every, student=" ".join(STUDENTS[student]), data=str(data / "bfcl.jsonl"),
                   held_out_questions=len(held_out), flags=table, answers_per_step=BATCH * ACCUMULATION)
    official = Official(args.official)
    if results.get("untrained", {}).get("rows") != len(held_out):  # measured once per results file
        results["untrained"] = measure_untrained(held_out, student, runs / student / "untrained_answers.jsonl")
        record_part(results, "untrained", [provenance()])
    results["untrained"] = official.rows([results["untrained"]])[0]
    for name in args.arms:
        directory = run_dir(runs, name, student, args.seed, args.steps)
        if needs_teacher(name, table[name]) and not (runs / "teacher" / "model").is_dir():
            raise SystemExit(f"arm {name} needs the teacher, {runs / 'teacher' / 'model'}: run the arm teacher first")
        sampling = None
        if name == "sft_teacher":
            answers = teacher_answers_path(runs, args.steps, args.seed)
            if not (answers.is_file() and answers.with_suffix(".json").is_file()):  # sampled again where either is gone
                write_teacher_answers(runs / "teacher" / "model", read_rows(data, "train"), answers,
                                      args.steps * BATCH * ACCUMULATION, args.seed)
            sampling = json.loads(answers.with_suffix(".json").read_text())
            results.setdefault("teacher_answers", {})[str(args.seed)] = sampling
        record = train(directory, table[name] + (["--seed", str(args.seed)] if args.seed and name != "teacher" else []),
                       args.resume)
        rows = curve(directory, partial(measure_checkpoint, held_out, directory / "answers"), args.resume)
        rows = with_training_signal(with_sampled_tokens(rows, directory, BATCH), directory)
        rows = official.rows(with_rewarded_answers(rows, directory, BATCH * ACCUMULATION))
        seconds = record["seconds"]
        if sampling is not None:  # the teacher's answers were sampled before step 1, spread over the steps trained
            rows = with_teacher_sampling(rows, sampling, args.steps)
            seconds += sampling["seconds"]
        if name != "teacher":
            rows = [{"step": 0, "seconds": 0.0, "sampled_tokens": 0.0, **results["untrained"]}, *rows]
        if args.seed and name != "teacher":
            results.setdefault("repeats", {}).setdefault(str(args.seed), {})[name] = {"rows": rows, "seconds": seconds}
            record_part(results, f"repeats/{args.seed}/{name}", record.get("provenance"))
        else:
            results["arms"][name], results["seconds"][name] = rows, seconds
            record_part(results, f"arms/{name}", record.get("provenance"))
        write_result(out, results)
    results["final"] = final_rows(results, "accuracy")
    results["right_at_final"] = right_at_final(results["final"], held_out, results.get("right_at_final", {}))
    results["paired"] = paired(results["right_at_final"], results.get("paired", {}))
    for seed in results.get("repeats", {}):
        right = right_at_final(last_rows_of_seed(results, seed), held_out,
                               results.get("repeats_right_at_final", {}).get(seed, {}))
        results.setdefault("repeats_right_at_final", {})[seed] = right
        results.setdefault("repeats_paired", {})[seed] = paired(right, results.get("repeats_paired", {}).get(seed, {}))
    write_result(out, results)
    plot_curves(results, out.with_suffix(".png"), "accuracy", "held-out accuracy (BFCL rules)")
    print_table(results)
    return 0


def print_table(results: dict) -> None:
    print("| arm | step | accuracy | BFCL's checker | agreement | calls / answer | cut | sampled tokens | minutes |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, rows in results["arms"].items():
        for r in rows:
            official = r.get("official")
            both = f"{official['bfcl_accuracy']:.3f} | {official['agreement']:.3f}" if official else "- | -"
            print(f"| {name} | {r['step']} | {r['accuracy']:.3f} | {both} | {r['calls_per_answer']:.2f} | "
                  f"{r['cut_rate']:.2f} | {r.get('sampled_tokens', 0.0):.0f} | {r['seconds'] / 60:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
