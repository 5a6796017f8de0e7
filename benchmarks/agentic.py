"""Distilling an agent, as curves against steps, on a bundled tool task (`--task`):

- `lookup` (`bundled:lookup`, `distill.tasks.lookup`): codes of an invented registry that only the tool `lookup_code`
  knows; the 32 held-out questions name entries no training row names. Its rows carry the teacher's behaviour (the
  conversation of a model using the tool well), so sft on them is a strong baseline.
- `chain` (`bundled:chain`, `distill.tasks.chain`): the code of an entry's partner, which takes two dependent calls
  (`partner_of`, then `code_of`); the teacher learns from the `demonstrations` split, the students see the `train`
  split, which holds only prompts, so only the teacher's behaviour can teach them; 40 held-out questions.

Arms of `lookup`, one after the other:

- teacher: SmolLM2-135M-Instruct (the default model) trained with `sft` on the task's tool-use conversations (the
  call, the result, the answer): the teacher of the arms below.
- gkd: the layer-dropped default model (student_init drop_every:3, 20 of 30 layers) distilled from that teacher
  with gkd's default schedule scaled to the budget: teacher-sampled conversations (`seq_kd`: the teacher acts in the
  tool loop) with forward KL for the first three quarters of the steps, then half of the micro-batches on-policy.
- on_policy: the same student, on-policy only: its own conversations, the method's default loss.
- sft: the same student trained on the dataset's conversations (no teacher).

Arms of `chain`: the teacher (sft on the demonstrations, 40 steps); then the layer-dropped student on the prompt-only
rows with plain `on_policy`; `guided` (Guided-OPD: teacher-written turns with a probability decaying from 0.5 to 0 over
three quarters of the steps); `tcod` (the depth curriculum: one more turn every 5 steps); `sod` (step-wise divergence
weighting); `on_policy_forward_kl` (plain `on_policy` at beta 0: the forward KL on the student's own conversations,
whose gradient at a token the student is sure of and the teacher is not stays whole where the default JSD's
vanishes); `guided_forward_kl` (`guided` at beta 0, as the `chain` recipe trains); `tcod_forward_kl` and
`sod_forward_kl` (`tcod` and `sod` at beta 0); `gkd` (the teacher's own
conversations first, then the student's); and `sft_teacher` (offline distillation: the teacher samples one
conversation per training conversation the on-policy arms sample, --steps x 8, at its seq_kd temperature 0.8, cycling
over the prompt-only rows; they are written as conversation rows, `teacher_conversations.jsonl`, and the student is
trained on them with `sft` for the same steps: as many teacher-sampled conversations as the on-policy arms sample of
their own). `--student full` runs the chain arms with the
untuned default model as the student instead of the layer-dropped one (learning rate 5e-5; `chain_full.json`).

Every arm keeps a checkpoint every --every steps; each is measured on the held-out questions: greedy conversations
through the tool loop (`distill.conversations`), task success (the last assistant turn holds the code), calls and
valid calls per question. Step 0 is the untrained student. Each row also gives the tokens sampled up to its step
(the student's and the teacher's turns, tool turns excluded: from the run's metrics.jsonl); `reverse_kl_by_turn` gives,
for each arm that samples the student's conversations, the logged reverse KL at each turn index at every step.

    python benchmarks/agentic.py [--task lookup|chain] [--steps 40] [--every 10] [--resume] [--arms NAME ...] [--seed N]
Writes benchmarks/results/agentic.json (chain: chain.json) and its .png and prints a table. `--seed N` (N > 0, with
--resume) repeats the student arms with training seed N (data order, sampling) into `repeats`, beside seed 0's
`arms`; the teacher is always seed 0's, and `final` gives each arm's last-checkpoint success for every seed measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from provenance import provenance, record_part, write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from curves import (  # noqa: E402  (a sibling script)
    curve,
    final_rows,
    metrics,
    parse_arm_arguments,
    plot_curves,
    train,
    with_sampled_tokens,
    with_teacher_sampling,
)

from distill.agents.setup import offering_tools, tool_loop
from distill.config import DistillConfig
from distill.conversations.tool_calls import parse_tool_calls
from distill.data import examples_from_dataset
from distill.data_files import load_dataset_spec
from distill.evaluation.evaluator import _last_run, tool_use
from distill.generation import SamplingParams, generate_completions
from distill.generation.engine import ConversationCache
from distill.models import DEFAULT_TEACHER, eos_token_ids
from distill.rendering import TextRenderer
from distill.seeds import row_seed
from distill.tasks.answers import contains_answer
from distill.teachers.build import load_model


@dataclass(frozen=True)
class Task:
    name: str
    dataset: str
    tools: tuple[str, ...]
    teacher_split: str  # the rows the teacher's sft reads
    held_out: int  # questions in the held-out split
    max_new_tokens: int
    max_turns: int
    out: str

    @property
    def runs(self) -> Path:
        return Path("runs/bench_agentic") if self.name == "lookup" else Path(f"runs/bench_{self.name}")

    @property
    def teacher(self) -> Path:
        return self.runs / "teacher" / "model"

    def common(self) -> list[str]:
        return ["--dataset", self.dataset, "--tools", ",".join(self.tools), "--max_new_tokens", str(self.max_new_tokens),
                "--max_turns", str(self.max_turns), "--per_device_train_batch_size", str(BATCH),
                "--gradient_accumulation_steps", "2"]


BATCH = 4
TASKS = {
    "lookup": Task("lookup", "bundled:lookup", ("distill.tasks.lookup:lookup_code",), "train", 32, 96, 4,
                   "benchmarks/results/agentic.json"),
    "chain": Task("chain", "bundled:chain", ("distill.tasks.chain:partner_of", "distill.tasks.chain:code_of"),
                  "demonstrations", 40, 160, 4, "benchmarks/results/chain.json"),
}
# The students: the layer-dropped default model (20 of its 30 layers: a weaker model of the teacher's family), or the
# untuned default model itself (a competent model that lacks the task's skill; the teacher is its sft), at a learning
# rate a whole pretrained student stands on its own samples (the recipes' 3e-4 is the layer-dropped student's).
STUDENTS = {"dropped": ["--student", DEFAULT_TEACHER, "--student_init", "drop_every:3"],
            "full": ["--student", DEFAULT_TEACHER, "--learning_rate", "5e-5"]}


def student_runs(task: Task, student: str) -> Path:
    """Where one student's arms run: the layer-dropped student's beside the teacher, as first recorded."""
    return task.runs if student == "dropped" else task.runs / student


def teacher_conversations_path(task: Task, student: str, seed: int) -> Path:
    """The teacher's sampled conversations the `sft_teacher` arm of `seed` trains on."""
    runs = student_runs(task, student)
    return (runs / f"seed{seed}" if seed else runs) / TEACHER_CONVERSATIONS


def student_out(task: Task, student: str) -> str:
    return task.out if student == "dropped" else task.out.replace(".json", f"_{student}.json")


def arms(task: Task, steps: int, every: int, student: str = "dropped", seed: int = 0) -> dict[str, list[str]]:
    budget = ["--max_steps", str(steps), "--save_steps", str(every)]
    common, teacher = task.common(), str(task.teacher)
    STUDENT = STUDENTS[student]
    if task.name == "lookup":
        return {
            "teacher": ["--method", "sft", "--student", DEFAULT_TEACHER, "--max_steps", "30", "--save_steps", "30",
                        "--learning_rate", "1e-4", *common],
            "gkd": ["--method", "gkd", "--teacher", teacher, *STUDENT, *budget, *common,
                    "--lmbda_schedule_steps", str(3 * steps // 4)],
            "on_policy": ["--method", "on_policy", "--teacher", teacher, *STUDENT, *budget, *common],
            "sft": ["--method", "sft", *STUDENT, *budget, *common],
        }
    on_policy = ["--method", "on_policy", "--teacher", teacher, *STUDENT, *budget, *common, "--dataset_split", "train"]
    guided = [*on_policy, "--guided_turns_probability", "0.5", "--guided_turns_decay_fraction", "0.75"]
    return {
        "teacher": ["--method", "sft", "--student", DEFAULT_TEACHER, "--max_steps", "40", "--save_steps", "40",
                    "--learning_rate", "1e-4", *common, "--dataset_split", task.teacher_split],
        "on_policy": on_policy,
        "guided": guided,
        "tcod": [*on_policy, "--depth_curriculum_interval", "5"],
        "sod": [*on_policy, "--step_divergence_weighting", "true"],
        "on_policy_forward_kl": [*on_policy, "--beta", "0"],
        "guided_forward_kl": [*guided, "--beta", "0"],
        "tcod_forward_kl": [*on_policy, "--depth_curriculum_interval", "5", "--beta", "0"],
        "sod_forward_kl": [*on_policy, "--step_divergence_weighting", "true", "--beta", "0"],
        "gkd": ["--method", "gkd", "--teacher", teacher, *STUDENT, *budget, *common, "--dataset_split", "train",
                "--lmbda_schedule_steps", str(3 * steps // 4)],
        "sft_teacher": ["--method", "sft", *STUDENT, *budget, *common[2:],
                        "--dataset", str(teacher_conversations_path(task, student, seed))],
    }


TEACHER_CONVERSATIONS = "teacher_conversations.jsonl"
TEACHER_TEMPERATURE = 0.8  # seq_kd's default teacher_sampling_temperature: what gkd's teacher-sampled turns use


def run_conversations(task: Task, model_dir: Path, examples: list, temperature: float | None = None, seed: int = 0):
    """Each example's conversation through the tool loop: greedy (`temperature` None), or sampled with one seed per
    row, turn and `seed`. Returns (trajectories, tokenizer)."""
    device = torch.device("cpu")
    model, tokenizer = load_model(str(model_dir), "student", device)
    eos = eos_token_ids(tokenizer, model)
    config = DistillConfig(tools=list(task.tools), max_new_tokens=task.max_new_tokens, max_turns=task.max_turns)
    encoder = offering_tools(config, TextRenderer(tokenizer, 256, task.max_new_tokens, eos))
    assert isinstance(encoder, TextRenderer)
    loop = tool_loop(config, encoder, task.max_new_tokens)
    assert loop is not None
    prompts = [encoder.prompt_ids(e.prompt, encoder.tools_of(e))[0] for e in examples]
    cache = ConversationCache()  # one batch of every question, each conversation kept from turn to turn
    sampling = SamplingParams(temperature or 1.0, 1.0, 0, task.max_new_tokens, do_sample=temperature is not None)

    def generate(batch, max_new_tokens, turn, rows):
        seeds = None if temperature is None else [row_seed(seed, turn, row) for row in rows]
        with torch.no_grad():
            return generate_completions(model, batch, replace(sampling, max_new_tokens=max_new_tokens), eos,
                                        tokenizer.pad_token_id, device, seeds=seeds, conversations=cache,
                                        conversation_keys=rows)

    try:
        trajectories, _ = loop.run(generate, prompts, examples, eos)
    finally:
        loop.close()  # its tool workers
    return trajectories, tokenizer


def conversation_messages(trajectory, decode) -> list[dict] | None:
    """A trajectory as the messages after its prompt: each model turn read back (its text, its Hermes calls as
    transformers' `tool_calls`), each environment turn as the tool messages it rendered; None when a turn holds a
    call that does not parse."""
    assert len(trajectory.pieces) == 1, "the chain task's template preserves prefixes: one piece per conversation"
    messages: list[dict] = []
    for span in trajectory.layout.spans():
        if not span.segment.assistant:
            messages.extend(dict(m) for m in span.segment.messages)
            continue
        turn = parse_tool_calls(decode(trajectory.ids[span.start:span.end]))
        if turn.malformed:
            return None
        message: dict = {"role": "assistant", "content": turn.content if turn.calls else decode(
            trajectory.ids[span.start:span.end]).strip()}
        if turn.calls:
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                     for c in turn.calls]
        messages.append(message)
    return messages


def write_teacher_conversations(task: Task, out: Path, count: int, seed: int) -> dict:
    """The teacher's own conversations on the prompt-only `train` rows (cycled to `count`), written as conversation
    rows (`prompt`, `completion` messages) that `sft` reads, but for those cut by the token budget, ending on a call
    or holding a call that does not parse (counted in "dropped"); what the sampling took ("teacher_tokens": every
    sampled turn's), also written beside them as .json."""
    rows = load_dataset_spec(task.dataset, "train", "dataset")
    examples = examples_from_dataset(rows, "dataset")
    picked = [i % len(examples) for i in range(count)]
    start = time.time()
    trajectories, tokenizer = run_conversations(task, task.teacher, [examples[i] for i in picked], TEACHER_TEMPERATURE,
                                                seed)
    decode = partial(tokenizer.decode, skip_special_tokens=True)
    lines, tokens, dropped = [], 0, 0
    for i, trajectory in zip(picked, trajectories):
        tokens += sum(trajectory.trained)
        messages = conversation_messages(trajectory, decode)
        if trajectory.hit_max or trajectory.unanswered_calls or messages is None:
            dropped += 1  # cut by the budget, ending on a call, or a call unread: sampled, but no conversation row
            continue
        lines.append(json.dumps({"prompt": rows[i]["prompt"], "completion": messages, "answer": rows[i].get("answer")}))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    sampling = {"conversations": count, "dropped": dropped, "teacher_tokens": tokens, "seconds": time.time() - start,
                "temperature": TEACHER_TEMPERATURE}
    out.with_suffix(".json").write_text(json.dumps(sampling, indent=2))
    return sampling


def turn_divergences(run_dir: Path) -> dict[str, dict[str, float]]:
    """{step: {turn k: the reverse KL of the step's sampled conversations at their turn k}} (`reverse_kl/turn_k`,
    averaged over the turn's tokens), for every step the run logged them; {} without the run's metrics."""
    if not (run_dir / "metrics.jsonl").is_file():
        return {}
    series = {}
    for record in metrics(run_dir):
        turns = {key.rsplit("_", 1)[1]: value for key, value in record.items() if key.startswith("reverse_kl/turn_")}
        if turns:
            series[str(int(record["step"]))] = dict(sorted(turns.items()))
    return series


def measure(task: Task, student_dir: Path) -> dict:
    """Greedy conversations on the held-out questions: task success, calls and valid calls per question."""
    examples = examples_from_dataset(load_dataset_spec(task.dataset, "heldout", "eval_dataset"), "eval_dataset")
    start = time.time()
    trajectories, tokenizer = run_conversations(task, student_dir, examples)
    finals = [tokenizer.decode(_last_run(t.ids, t.trained), skip_special_tokens=True) for t in trajectories]
    # An answer is a last turn that holds the code and calls nothing: a third call passing the code as its argument
    # is not one (the results recorded before this rule counted it: chain_full.json's sod arm).
    solved = 0
    for text, example in zip(finals, examples):
        assert example.answer is not None, f"{task.dataset}: every held-out row has the answer to check"
        solved += contains_answer(text, example.answer) and not parse_tool_calls(text).calls
    success = solved / len(examples)
    use = tool_use(trajectories)
    return {"success": success, "calls_per_question": use["calls_per_question"], "valid_call_rate": use["valid_call_rate"],
            "turns_per_question": use["turns_per_question"], "measure_seconds": time.time() - start,
            "example": tokenizer.decode(trajectories[0].ids, skip_special_tokens=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=list(TASKS), default="lookup")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0, help="the student arms' training seed (the teacher's is 0)")
    parser.add_argument("--student", choices=list(STUDENTS), default="dropped",
                        help="dropped: the layer-dropped default model; full: the untuned default model "
                             "(results in <out>_full.json)")
    known = parser.parse_known_args()[0]
    task, student = TASKS[known.task], known.student  # the task decides the arms --arms chooses from
    names = arms(task, 40, 10)
    args = parse_arm_arguments(parser, names, student_out(task, student))
    table = arms(task, args.steps, args.every, student, args.seed)
    runs = student_runs(task, student)
    out = Path(args.out)
    results = json.loads(out.read_text()) if args.resume and out.is_file() else {"arms": {}, "seconds": {}}
    results.update(steps=args.steps, every=args.every, task=task.dataset, tools=list(task.tools),
                   held_out_questions=task.held_out, student=" ".join(STUDENTS[student]))
    measured = partial(measure, task)
    start_row = None
    for name in args.arms:
        repeat = args.seed != 0 and name != "teacher"
        if name == "teacher":
            run_dir = task.runs / name
        else:
            run_dir = runs / f"seed{args.seed}" / name if repeat else runs / name
        sampling = None
        if name == "sft_teacher":
            conversations = teacher_conversations_path(task, student, args.seed)
            if not conversations.with_suffix(".json").is_file():
                write_teacher_conversations(task, conversations, args.steps * BATCH * 2, args.seed)
            sampling = json.loads(conversations.with_suffix(".json").read_text())
            results.setdefault("teacher_conversations", {})[str(args.seed)] = sampling
        record = train(run_dir, table[name] + (["--seed", str(args.seed)] if repeat else []), args.resume)
        rows = with_sampled_tokens(curve(run_dir, measured, args.resume), run_dir, BATCH)
        if sampling is not None:  # the teacher's conversations were sampled before step 1
            rows = with_teacher_sampling(rows, sampling, args.steps)
            record = {**record, "seconds": record["seconds"] + sampling["seconds"]}
        divergences = turn_divergences(run_dir)
        if name != "teacher":
            if start_row is None:  # the untrained student, measured once
                if "untrained" not in results:
                    results["untrained"] = measure_untrained(task, student)
                    record_part(results, "untrained", [provenance()])
                start_row = results["untrained"]
            rows = [{"step": 0, "seconds": 0.0, **start_row}, *rows]
        if repeat:
            results.setdefault("repeats", {}).setdefault(str(args.seed), {})[name] = {
                "rows": rows, "seconds": record["seconds"], "reverse_kl_by_turn": divergences}
            record_part(results, f"repeats/{args.seed}/{name}", record.get("provenance"))
        else:
            record_part(results, f"arms/{name}", record.get("provenance"))
            results["arms"][name], results["seconds"][name] = rows, record["seconds"]
            if divergences:  # the arms whose student samples conversations the teacher scores
                results.setdefault("reverse_kl_by_turn", {})[name] = divergences
        write_result(out, results)
    # The last checkpoint of each arm, with what it spent (seed 0), and its success for every seed: the docs read this.
    results["final"] = final_rows(results, "success")
    write_result(out, results)
    plot_curves(results, out.with_suffix(".png"), "success", "held-out task success")
    print("| arm | step | task success | calls / question | valid calls |\n| --- | ---: | ---: | ---: | ---: |")
    for name, rows in results["arms"].items():
        for r in rows:
            valid = "-" if r["valid_call_rate"] is None else f"{r['valid_call_rate']:.2f}"
            print(f"| {name} | {r['step']} | {r['success']:.3f} | {r['calls_per_question']:.2f} | {valid} |")


def measure_untrained(task: Task, student: str) -> dict:
    """The student before training: the default model itself, or the layer-dropped one built as the arms build it
    (saved once)."""
    from distill.models import make_student

    if student == "full":
        return measure(task, Path(DEFAULT_TEACHER))
    target = task.runs / "untrained"
    if not (target / "config.json").is_file():
        model, tokenizer = load_model(DEFAULT_TEACHER, "student", torch.device("cpu"))
        make_student(model, "drop_every:3").save_pretrained(target)
        tokenizer.save_pretrained(target)
    return measure(task, target)


if __name__ == "__main__":
    main()
