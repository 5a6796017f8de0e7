"""How close a student is to its teacher on held-out prompts.

Per-token forward KL(teacher || student) and reverse KL(student || teacher) over the full vocabulary (at
temperature 1), and top-1 agreement, measured on two sets of completions: ones the teacher samples (what
forward KL is an expectation over) and ones the student samples (where on-policy errors show). Plus greedy
answers side by side, and, when the prompts have an `answer`, how often the greedy answer contains it
(`distill.tasks.answers`); when they carry a BFCL column, how often its calls are right by BFCL's rules
(`distill.tasks.bfcl.scoring`). Sampling is seeded and runs in a forked RNG, so evaluating never changes training.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distill.agents.setup import tool_loop
from distill.batch import Completion, collate
from distill.conversations.layout import Layout
from distill.conversations.tools import FAILURES
from distill.data import Example
from distill.evaluation.leakage import LEAK_WORDS, template_leakage
from distill.evaluation.repetition import MAX_PERIOD, MIN_LOOP_WORDS, MIN_REPEATS, repetition
from distill.generation import AUTO, SamplingParams, generate_completions
from distill.no_grad import no_grad
from distill.objectives import DivergenceObjective, StepContext
from distill.objectives.student import student_loss
from distill.rendering import Renderer
from distill.seeds import row_seeds
from distill.tasks.answers import contains_answer
from distill.tasks.bfcl.scoring import evaluate_calls
from distill.teachers import Teacher

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.methods.base import Method


@dataclass
class EvalSettings:
    max_new_tokens: int
    batch_size: int
    num_examples: int
    seed: int
    chunk_size: int = 256
    generation_engine: str = AUTO
    leak_templates: tuple[str, ...] = ()  # a self-teacher's prompt templates: report `template_leakage`
    tool_loop: Any = None  # `distill.agents.loop.ToolLoop`: greedy answers are conversations (the run's tools)


def eval_settings(config: DistillConfig, method: Method, encoder: Renderer, batch_size: int | None = None) -> EvalSettings:
    """The evaluation's settings from the run's config, the one place they are made (training's evaluation and
    `distill eval`'s): `encoder` renders the tool-call loop's turns when the run has tools; `batch_size` replaces
    `eval_batch_size`; a self-teacher's prompt templates are checked for leaking into answers."""
    c = config
    return EvalSettings(c.eval_max_new_tokens, batch_size or c.eval_batch_size, c.eval_examples, c.seed, c.loss_chunk_size,
                        c.generation_engine, tuple(getattr(c, f) for f in method.template_fields),
                        tool_loop(c, encoder, c.eval_max_new_tokens))


@dataclass(frozen=True)
class GreedyAnswers:
    """Greedy answers to every prompt: `answers`, the text scored (a conversation's last assistant turn); `shown`, the
    text shown side by side (a conversation whole); `tool_use`: the conversations' tool statistics, None without tools."""

    answers: list[str]
    shown: list[str]
    tool_use: dict | None = None


def tool_use(trajectories: list) -> dict:
    """Per question: turns, calls, and the share of calls that were valid (a known tool, arguments that parse and
    fit); failures by kind, over all calls; with an environment that owns a reward, its mean ("environment_reward")."""
    calls = sum(t.calls for t in trajectories)
    failed = {kind: sum(t.failures[kind] for t in trajectories) for kind in FAILURES}
    invalid = failed["malformed_call"] + failed["unknown_tool"] + failed["bad_arguments"]
    n = max(len(trajectories), 1)
    rewards = [t.reward for t in trajectories if t.reward is not None]
    return {"questions": len(trajectories), "turns_per_question": sum(t.turns for t in trajectories) / n,
            "calls_per_question": calls / n, "valid_call_rate": (calls - invalid) / calls if calls else None,
            "failed": failed, "unanswered_calls": sum(t.unanswered_calls for t in trajectories)} | (
        {"environment_reward": sum(rewards) / len(rewards)} if rewards else {})


def divergence_objective(chunk_size: int) -> DivergenceObjective:
    """The evaluation's objective: forward KL (beta 0) at temperature 1, whatever the run trained with."""
    return DivergenceObjective.constant(0.0, 1.0, chunk_size)


@no_grad
def score_completions(student, teacher: Teacher, completions: list[Completion], vocab_size: int, pad_id: int,
                      device: torch.device, settings: EvalSettings) -> dict[str, float]:
    """Token means of forward KL, reverse KL and top-1 agreement over the given completions.

    Over the full vocabulary for a local teacher; on the coarsened support (top-k + tail) for a sparse one.
    A teacher with another tokenizer (`teacher.aligned`) has no same-vocabulary KL: its aligned divergence
    (ULD, or hybrid ULD at beta 0), per student token, is reported instead, as "aligned_divergence".
    """
    if teacher.aligned:
        return _score_aligned(student, teacher, completions, vocab_size, pad_id, device, settings)
    totals = {"forward_kl": 0.0, "reverse_kl": 0.0, "top1_agreement": 0.0}
    tokens = 0
    objective = divergence_objective(settings.chunk_size)
    for start in range(0, len(completions), settings.batch_size):
        batch = collate(completions[start : start + settings.batch_size], "eval", pad_id).to(device)
        if batch.num_completion_tokens == 0:
            continue
        out = student_loss(student, vocab_size, batch, teacher.score(batch, 1.0), objective, StepContext("eval", return_stats=True))
        for name in totals:
            totals[name] += float(getattr(out.stats, name).double().sum())
        tokens += int(out.num_tokens)
    result = {name: value / max(tokens, 1) for name, value in totals.items()}
    result["tokens"] = tokens
    return result


def _score_aligned(student, teacher, completions, vocab_size, pad_id, device, settings: EvalSettings) -> dict[str, float]:
    total, tokens = 0.0, 0
    objective = divergence_objective(settings.chunk_size)
    for start in range(0, len(completions), settings.batch_size):
        batch = collate(completions[start : start + settings.batch_size], "eval", pad_id).to(device)
        if batch.num_completion_tokens == 0:
            continue
        signal = teacher.score_divergence(batch, 1.0)
        out = student_loss(student, vocab_size, batch, signal, objective, StepContext("eval"))
        total += float(out.loss_sum)
        tokens += int(out.num_tokens)
    return {"aligned_divergence": total / max(tokens, 1), "tokens": tokens}


def question_text(prompt: str | list[dict]) -> str:
    """The text a prompt asks: a text prompt, or its last turn's text (a turn showing images: its text blocks)."""
    if isinstance(prompt, str):
        return prompt
    content = prompt[-1]["content"]
    return content if isinstance(content, str) else "".join(b["text"] for b in content if b.get("type") == "text")


def headline(metrics: dict) -> tuple[str, str, str]:
    """(metric key, completions, label) of the evaluation's main number: forward KL, or the aligned divergence
    across tokenizers; on the teacher's completions, or the student's own when the teacher only scores."""
    part = "on_teacher_completions" if "on_teacher_completions" in metrics else "on_student_completions"
    where = "teacher completions" if part == "on_teacher_completions" else "the student's own completions"
    if "aligned_divergence" in metrics[part]:
        return "aligned_divergence", part, f"Aligned divergence (ULD) on {where}"
    return "forward_kl", part, f"Forward KL on {where}"


def _sample(generate, prompts, settings: EvalSettings, device, greedy: bool) -> list[list[int]]:
    """`generate(prompts, sampling, batch_size, seeds)` in a forked RNG seeded by `settings.seed`, with per-row
    seeds from it too: every evaluation of a run samples its prompts alike, before training and after."""
    sampling = SamplingParams(1.0, 1.0, 0, settings.max_new_tokens, do_sample=not greedy, engine=settings.generation_engine)
    seeds = row_seeds(len(prompts), settings.seed, "evaluation")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(settings.seed)
        outputs = generate(prompts, sampling, settings.batch_size, seeds)
    return [sample.ids for sample in outputs]


@dataclass(frozen=True)
class Sample:
    """One sampled completion to score: the prompt it followed (with an environment's observation), its ids, and a
    conversation's trained mask and layout (None for a single answer); `later`: a conversation's later pieces, where
    its template re-renders its history (each scored in its own context)."""

    prompt_ids: list[int]
    ids: list[int]
    trained: tuple[bool, ...] | None = None
    layout: Layout | None = None
    later: tuple["Sample", ...] = ()


class Evaluator:
    """Evaluates students against one teacher on one prompt set; the teacher's outputs are computed once.

    With the run's tools (`EvalSettings.tool_loop`) every sample is a conversation through the tool-call loop: the
    greedy ones (answers, tool use) and the sampled ones the divergences are measured on, over the model's turns
    only. A teacher acts in the loop when its `generate` continues the ids it is given (`continues_prompts`); one
    that renders its own prompts (another tokenizer, a self-teacher) has no samples or answers of its own there."""

    def __init__(self, teacher: Teacher, tokenizer, encoder: Renderer, examples: list[Example],
                 vocab_size: int, eos_ids: list[int], pad_id: int, device: torch.device, settings: EvalSettings):
        self.teacher, self.tokenizer, self.examples = teacher, tokenizer, examples
        self.vocab_size, self.eos_ids, self.pad_id, self.device, self.settings = vocab_size, eos_ids, pad_id, device, settings
        self.prompts = [encoder.prompt(e).ids for e in examples]
        self.extras = [encoder.extras(e) for e in examples]  # the model kind's inputs beyond the ids
        self.prompt_texts = [question_text(e.prompt) for e in examples]
        self._teacher_samples: list[Sample] | None = None
        self._teacher_greedy: GreedyAnswers | None = None
        self.teacher_acts = teacher.can_generate and (settings.tool_loop is None or teacher.continues_prompts)

    def close(self) -> None:
        """The evaluation is done: the tool-call loop's workers end (they start again if it evaluates again)."""
        if self.settings.tool_loop is not None:
            self.settings.tool_loop.close()

    def _completions(self, samples: list[Sample], source: str) -> list[Completion]:
        return [Completion(p.prompt_ids, p.ids, source, example=e, extras=x, trained_mask=p.trained, layout=p.layout,
                           piece=k)
                for s, e, x in zip(samples, self.examples, self.extras) for k, p in enumerate((s, *s.later))]

    def _teacher_generate(self, prompts, sampling, batch_size, seeds):
        return self.teacher.generate(prompts, sampling, batch_size, examples=self.examples[: len(prompts)], seeds=seeds,
                                     extras=self.extras[: len(prompts)])

    def teacher_samples(self) -> list[Sample]:
        if self._teacher_samples is None:
            self._teacher_samples = self._samples(self._teacher_generate)
        return self._teacher_samples

    def _samples(self, generate) -> list[Sample]:
        """A sampled completion of every prompt (temperature 1), or with the run's tools a sampled conversation."""
        if self.settings.tool_loop is None:
            return [Sample(p, ids) for p, ids in zip(self.prompts, _sample(generate, self.prompts, self.settings, self.device,
                                                                           greedy=False))]
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(self.settings.seed)
            trajectories, followed = self._conversations(generate, greedy=False)
        return [_conversation_sample(t.sample(p, with_log_probs=False)) for p, t in zip(followed, trajectories)]

    def _conversations(self, generate, greedy: bool):
        """(trajectories, the prompts they followed) of every prompt through the tool-call loop; each turn seeded per
        row, so every evaluation of a run samples alike."""
        loop = self.settings.tool_loop

        def turn(batch, max_new_tokens: int, number: int, rows: list[int]):
            seeds = row_seeds(len(self.prompts), self.settings.seed, "evaluation" if number == 0 else f"evaluation turn {number}")
            sampling = SamplingParams(1.0, 1.0, 0, max_new_tokens, do_sample=not greedy, engine=self.settings.generation_engine)
            return generate(batch, sampling, self.settings.batch_size, [seeds[r] for r in rows])

        return loop.run(turn, self.prompts, self.examples, self.eos_ids)

    def _teacher_greedy_answers(self) -> GreedyAnswers:
        """The teacher's greedy answer to every prompt (computed once; a teacher that can generate)."""
        if self._teacher_greedy is None:
            self._teacher_greedy = self._greedy(self._teacher_generate)
        return self._teacher_greedy

    def _greedy(self, generate) -> GreedyAnswers:
        """Greedy answers to every prompt: completions, or with the run's tools conversations (the tool-call loop)."""
        if self.settings.tool_loop is None:
            texts = [self.decode(ids) for ids in _sample(generate, self.prompts, self.settings, self.device, greedy=True)]
            return GreedyAnswers(texts, texts)
        trajectories, _ = self._conversations(generate, greedy=True)
        finals = [self.decode(_last_run(t.ids, t.trained)) for t in trajectories]
        return GreedyAnswers(finals, [self.decode(_conversation_ids(t)) for t in trajectories], tool_use(trajectories))

    def teacher_answers(self) -> list[str | None]:
        """Greedy teacher answers to the shown prompts, or None for each when the teacher only scores (a server)."""
        if not self.teacher_acts:
            return [None] * min(self.settings.num_examples, len(self.prompts))
        return list(self._teacher_greedy_answers().shown[: self.settings.num_examples])

    def teacher_repetition(self) -> dict | None:
        """`repetition` of the teacher's greedy answers to every prompt: what the student's are compared with;
        None for a teacher that only scores."""
        return repetition(self._teacher_greedy_answers().answers) if self.teacher_acts else None

    def teacher_sampled_repetition(self) -> dict | None:
        """`repetition` of the teacher's sampled answers (temperature 1, the completions the divergences are measured
        on): beside the greedy one, it tells a loop of greedy decoding from a loop of the distribution itself."""
        return repetition([self.sample_text(s) for s in self.teacher_samples()]) if self.teacher_acts else None

    def sample_text(self, sample: Sample) -> str:
        """The answer a sample gives: its text, or a conversation's last assistant turn."""
        last = sample.later[-1] if sample.later else sample  # a conversation's answer is in its last piece
        return self.decode(last.ids if last.trained is None else _last_run(last.ids, list(last.trained)))

    def teacher_answer_accuracy(self) -> dict | None:
        """`answer_accuracy` of the teacher's greedy answers (what the student's are compared with); None for a teacher
        that only scores, or prompts without answers."""
        return answer_accuracy(self._teacher_greedy_answers().answers, self.examples) if self.teacher_acts else None

    def teacher_tool_use(self) -> dict | None:
        """The teacher's greedy conversations' tool statistics (with tools, a teacher that generates), or None."""
        return self._teacher_greedy_answers().tool_use if self.teacher_acts else None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()

    def _student_generate(self, student):
        return lambda prompts, sampling, batch_size, seeds: generate_completions(
            student, prompts, sampling, self.eos_ids, self.pad_id, self.device, batch_size, vocab_size=self.vocab_size,
            seeds=seeds, extras=self.extras[: len(prompts)])

    def evaluate(self, student) -> dict:
        """{"on_teacher_completions": {...}, "on_student_completions": {...}, "answers": [...]}, and
        "repetition" (greedy, over every prompt: `distill.evaluation.repetition`), "sampled_repetition" (the same over
        the student's own samples at temperature 1, which the divergences are measured on), "answer_accuracy" (greedy, over
        the prompts with an answer) when any prompt has one, "bfcl" and "bfcl_calls" (greedy, over the rows with a BFCL
        column: `distill.tasks.bfcl.scoring`), and "template_leakage" (greedy, over every prompt) when the settings
        name templates."""
        was_training = student.training
        student.eval()
        try:
            own = self._samples(self._student_generate(student))
            greedy = self._greedy(self._student_generate(student))
            answers = greedy.answers
            result: dict[str, Any] = {}
            if self.teacher_acts:  # a scoring-only teacher (server) has no samples of its own
                result["on_teacher_completions"] = score_completions(
                    student, self.teacher, self._completions(self.teacher_samples(), "teacher"), self.vocab_size, self.pad_id,
                    self.device, self.settings)
            result["on_student_completions"] = score_completions(student, self.teacher, self._completions(own, "student"),
                                                                 self.vocab_size, self.pad_id, self.device, self.settings)
            result["answers"] = greedy.shown[: self.settings.num_examples]
            result["repetition"] = repetition(answers)
            result["sampled_repetition"] = repetition([self.sample_text(s) for s in own])
            if greedy.tool_use is not None:
                result["tool_use"] = greedy.tool_use
            accuracy = answer_accuracy(answers, self.examples)
            if accuracy is not None:
                result["answer_accuracy"] = accuracy
            scored_calls = evaluate_calls([e.row for e in self.examples], answers)
            if scored_calls is not None:  # rows with a BFCL column: the greedy answer's calls by BFCL's rules
                result["bfcl"], result["bfcl_calls"] = scored_calls
            if self.settings.leak_templates:
                result["template_leakage"] = template_leakage(answers, self.prompt_texts, self.settings.leak_templates)
            return result
        finally:
            student.train(was_training)


def answer_accuracy(answers: list[str], examples: list[Example]) -> dict | None:
    """How many greedy answers contain their row's answer, over the rows that have one; None when none has."""
    checked = [(text, example.answer) for text, example in zip(answers, examples) if example.answer is not None]
    if not checked:
        return None
    correct = sum(contains_answer(text, answer) for text, answer in checked)
    return {"correct": correct, "prompts": len(checked), "accuracy": correct / len(checked)}


def build_report(evaluator: Evaluator, results: dict[str, dict]) -> dict:
    """Combine evaluations (e.g. {"before": ..., "after": ...}) with the teacher's answers."""
    examples = []
    for i, answer in enumerate(evaluator.teacher_answers()):
        entry = {"prompt": evaluator.prompt_texts[i]} | ({"teacher": answer} if answer is not None else {})
        for name, result in results.items():
            entry[f"student_{name}"] = result["answers"][i]
        examples.append(entry)
    metrics = {name: {k: v for k, v in result.items() if k not in ("answers", "bfcl_calls")} for name, result in results.items()}
    report: dict[str, Any] = {"num_prompts": len(evaluator.prompts), "metrics": metrics, "examples": examples}
    calls = {name: result["bfcl_calls"] for name, result in results.items() if "bfcl_calls" in result}
    if calls:  # every scored row's decoded calls: what scripts/bfcl_official_check.sh scores with BFCL's own checker
        report["bfcl_calls"] = calls
    teacher_repetition = evaluator.teacher_repetition()
    if teacher_repetition is not None:
        teacher_tools, teacher_accuracy = evaluator.teacher_tool_use(), evaluator.teacher_answer_accuracy()
        report["teacher"] = ({"repetition": teacher_repetition, "sampled_repetition": evaluator.teacher_sampled_repetition()}
                             | ({"tool_use": teacher_tools} if teacher_tools else {})
                             | ({"answer_accuracy": teacher_accuracy} if teacher_accuracy else {}))
    return report


def report_markdown(report: dict) -> str:
    key, part_shown, label_text = headline(next(iter(report["metrics"].values())))
    lines = [f"# Evaluation on {report['num_prompts']} held-out prompts", ""]
    if key == "aligned_divergence":
        lines += ["The teacher has another tokenizer: per student token, the aligned divergence (ULD, or hybrid ULD at "
                  "beta 0) between byte-aligned groups of student and teacher tokens, at temperature 1.", "",
                  "| student | completions | aligned divergence | tokens |", "| --- | --- | ---: | ---: |"]
    else:
        lines += ["Per-token means at temperature 1 (nats), over the full vocabulary for a local teacher, over the "
                  "teacher's top-K + the token + a tail bucket for a server teacher (a lower bound).", "",
                  "| student | completions | forward KL | reverse KL | top-1 agreement | tokens |",
                  "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name, metrics in report["metrics"].items():
        for part, label in (("on_teacher_completions", "teacher's"), ("on_student_completions", "student's own")):
            if part not in metrics:  # a teacher that only scores (a server) has no completions of its own
                continue
            m = metrics[part]
            if key == "aligned_divergence":
                lines.append(f"| {name} | {label} | {m['aligned_divergence']:.4f} | {m['tokens']} |")
            else:
                lines.append(f"| {name} | {label} | {m['forward_kl']:.3f} | {m['reverse_kl']:.3f} | {m['top1_agreement']:.3f} | {m['tokens']} |")
    if "before" in report["metrics"] and "after" in report["metrics"]:
        before = report["metrics"]["before"][part_shown][key]
        after = report["metrics"]["after"][part_shown][key]
        # A student that starts as its teacher (sft's, sdft's evaluation teacher: the initial model) is at 0: no ratio.
        ratio = f" (after / before = {after / before:.3f})" if before > 1e-6 else ""
        lines += ["", f"{label_text}: {before:.3f} -> {after:.3f}{ratio}."]
    accuracy = {name: m["answer_accuracy"] for name, m in report["metrics"].items() if "answer_accuracy" in m}
    if accuracy:
        teacher = report.get("teacher", {}).get("answer_accuracy")
        shown = ({"teacher": teacher} if teacher else {}) | accuracy
        lines += ["", "Answer accuracy (greedy answer contains the row's answer): " + ", ".join(
            f"{name} {a['correct']}/{a['prompts']} = {a['accuracy']:.3f}" for name, a in shown.items()) + "."]
    bfcl = {name: m["bfcl"] for name, m in report["metrics"].items() if "bfcl" in m}
    if bfcl:
        lines += ["", "BFCL calls right by its AST rules (greedy answers, distill's checker): " + ", ".join(
            f"{name} {b['correct']}/{b['rows']} = {b['accuracy']:.3f}" for name, b in bfcl.items()) + "."]
    leakage = {name: m["template_leakage"] for name, m in report["metrics"].items() if "template_leakage" in m}
    if leakage:
        lines += ["", f"Template leakage (greedy answers repeating {LEAK_WORDS} or more words of the self-teacher's prompt "
                  "template that the question does not hold): " + ", ".join(
                      f"{name} {t['leaked']}/{t['answers']} = {t['fraction']:.3f}" + (f" ('{t['example']}')" if t["example"] else "")
                      for name, t in leakage.items()) + "."]
    lines += repetition_lines(report) + tool_use_lines(report)
    lines += ["", "## Greedy answers", ""]
    for example in report["examples"]:
        lines.append(f"**Prompt:** {example['prompt']}")
        lines.append("")
        for key, value in example.items():
            if key != "prompt":
                lines.append(f"- *{key.replace('_', ' ')}:* {value!r}")
        lines.append("")
    return "\n".join(lines)


def _conversation_ids(trajectory) -> list[int]:
    """A trajectory's conversation after its prompt: its ids, or for one in pieces its last piece's context from
    where it leaves the row's prompt, then that piece's ids (the whole conversation as the template last rendered it)."""
    first, last = trajectory.pieces[0], trajectory.pieces[-1]
    if last is first:
        return list(first.ids)
    common = next((k for k, (a, b) in enumerate(zip(first.prompt, last.prompt)) if a != b), len(first.prompt))
    return last.prompt[common:] + last.ids


def _conversation_sample(sample) -> Sample:
    """A sampled conversation (`distill.generation.sample.Sample`, its later pieces too) as the evaluation scores it."""
    return Sample(sample.prompt_ids, sample.ids, sample.trained, sample.layout,
                  tuple(_conversation_sample(piece) for piece in sample.later))


def _last_run(ids: list[int], trained: list[bool]) -> list[int]:
    """The last run of trained ids: a conversation's last assistant turn."""
    end = max((k + 1 for k, flag in enumerate(trained) if flag), default=0)
    start = end
    while start > 0 and trained[start - 1]:
        start -= 1
    return ids[start:end]


def tool_use_lines(report: dict) -> list[str]:
    """The tool-use sentence of eval.md: the teacher's (when it generates) and each evaluation's."""
    found = ({"teacher": report["teacher"]["tool_use"]} if "tool_use" in report.get("teacher", {}) else {})
    found |= {name: m["tool_use"] for name, m in report["metrics"].items() if "tool_use" in m}
    if not found:
        return []

    def valid(rate) -> str:
        return "no calls" if rate is None else f"{rate:.3f} of calls valid"

    return ["", "Tool use of the greedy conversations (answer accuracy is on each conversation's last assistant turn): "
            + ", ".join(f"{name} {u['calls_per_question']:.2f} calls and {u['turns_per_question']:.2f} turns per question, "
                        f"{valid(u['valid_call_rate'])}" + (f", environment reward {u['environment_reward']:.3f}"
                                                            if "environment_reward" in u else "")
                        for name, u in found.items()) + "."]


def repetition_lines(report: dict) -> list[str]:
    """The repetition sentences of eval.md, greedy answers then samples at temperature 1: the teacher's (when it
    generates) and each evaluation's."""
    lines = []
    for key, answers in (("repetition", "greedy answers"), ("sampled_repetition", "answers sampled at temperature 1")):
        found = ({"teacher": report["teacher"][key]} if report.get("teacher", {}).get(key) else {})
        found |= {name: m[key] for name, m in report["metrics"].items() if key in m}
        if not found:
            continue
        lines += ["", f"Repetition of the {answers} (looping: the answer ends in a unit of up to {MAX_PERIOD} words "
                  f"repeated at least {MIN_REPEATS} times to its end, over {MIN_LOOP_WORDS} words or more; distinct-2: "
                  "distinct word pairs over all pairs): "
                  + ", ".join(f"{name} {r['looping']}/{r['answers']} looping = {r['loop_fraction']:.3f}, distinct-2 "
                              f"{r['distinct_2']:.3f}" + (f" ('{r['example']}')" if r["example"] else "")
                              for name, r in found.items()) + "."]
    return lines


def write_report(report: dict, directory: Path) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    json_path, md_path = directory / "eval.json", directory / "eval.md"
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    md_path.write_text(report_markdown(report))
    return json_path, md_path


def summary_lines(report: dict) -> list[str]:
    """The console summary printed at the end of `distill train` and by `distill eval`."""
    return report_markdown(report).splitlines()
