"""The student's samples of a step: one batched `generate` over every on-policy micro-batch of this process, or with
tools one conversation per row (the tool-call loop). What both rollout producers sample with: the synchronous one on
the training thread, the asynchronous one on its worker, from its copy of the student.

A conversation's curricula (`distill.agents.guidance`) act here, by step: the teacher writes the turns Guided-OPD's
draw gives it (each row keyed by its place among the step's rows over all processes, so the choice does not depend on
the split), and TCOD's depth bounds the turns."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Protocol, cast

import torch

from distill.agents.loop import Guide, ToolLoop, loop_metrics
from distill.data import EncodedExample, Example
from distill.generation import generate_completions
from distill.generation.engine import ConversationCache
from distill.generation.sample import Sample
from distill.seeds import row_seed, row_seeds
from distill.training.plan import RolloutSchedule, RolloutSettings
from distill.training.runtime import phase_clock

if TYPE_CHECKING:
    from distill.teachers.base import Teacher

WithModel = Callable[[Callable], object]  # with_model(run): run(model) with the model that samples, its result returned
Metrics = dict[str, tuple[float, float]]  # name -> (numerator, denominator)


class RowSeeds(Protocol):
    def __call__(self, step: int, count: int, purpose: str) -> list[int]:
        """One sampling seed per on-policy row of `step` (`purpose`: "student", or a later turn's)."""


class ProcessRowSeeds:
    """Seeds keyed by the row's place among this process's on-policy rows of the step (the synchronous producer)."""

    def __init__(self, seed: int, process_index: int):
        self.seed, self.process_index = seed, process_index

    def __call__(self, step: int, count: int, purpose: str) -> list[int]:
        return row_seeds(count, self.seed, purpose, step, self.process_index)


class StudentSampler:
    """The student's samples of a step's on-policy micro-batches (`sample`). `seeds`: the rows' sampling seeds;
    `seeded_rows`: every engine draws each row from its own seed, never from torch's process RNG (the asynchronous
    producer's worker: its samples must not depend on timing); `teacher`: writes the turns Guided-OPD gives it
    (`settings.guided_turns`), a teacher that continues the student's ids."""

    def __init__(self, schedule: RolloutSchedule, examples: list[Example], encoded: list[EncodedExample],
                 settings: RolloutSettings, eos_ids: list[int], pad_id: int, vocab_size: int, device: torch.device,
                 seeds: RowSeeds, seeded_rows: bool = False, teacher: Teacher | None = None):
        self.schedule, self.examples, self.encoded, self.settings = schedule, examples, encoded, settings
        self.eos_ids, self.pad_id, self.vocab_size, self.device = eos_ids, pad_id, vocab_size, device
        self.seeds, self.seeded_rows, self.teacher = seeds, seeded_rows, teacher
        if settings.guided_turns is not None and (teacher is None or not teacher.can_generate
                                                  or not teacher.continues_prompts):
            what = "no teacher" if teacher is None else f"a {type(teacher).__name__}"
            raise ValueError(f"guided_turns_probability > 0 (Guided-OPD): the teacher writes turns of the student's "
                             f"conversations by continuing their token ids, and this run has {what}, which cannot (it "
                             "samples from prompts of its own, or not at all); use a teacher model with the student's "
                             "tokenizer, or set guided_turns_probability: 0")

    def sample(self, step: int, with_student: WithModel, timings: dict[str, float], loop_metrics_into: Metrics,
               clock: Callable[[torch.device], float] = phase_clock) -> dict[int, list[Sample]]:
        """The student's samples of `step`'s on-policy micro-batches, by micro-batch index, one per row (a conversation's
        with its trained mask, prompt followed and layout), sampled by the model `with_student` runs (the student as it
        is now, or the asynchronous producer's copy); the tool-call loop's metrics are added to `loop_metrics_into`;
        `clock` times it (a worker thread's must not wait for the training thread's kernels)."""
        sources = self.schedule.sources(step)
        groups = self.schedule.prompt_groups(step)
        on_policy = [i for i, s in enumerate(sources) if s == "student"]
        if not on_policy:
            return {}
        prompts = [self.encoded[j].prompt_ids for i in on_policy for j in groups[i]]
        extras = [self.encoded[j].extras for i in on_policy for j in groups[i]]
        start = clock(self.device)
        seeds = self.seeds(step, len(prompts), "student")
        if self.settings.tool_loop is not None:
            rows = [self.examples[j] for i in on_policy for j in groups[i]]
            samples = self._conversations(self.settings.tool_loop, step, prompts, rows, extras, with_student,
                                          loop_metrics_into)
        else:
            samples = cast(list[Sample], with_student(lambda student: generate_completions(
                student, prompts, self.settings.student_sampling, self.eos_ids, self.pad_id, self.device,
                vocab_size=self.vocab_size, with_log_probs=self.settings.record_log_probs, seeds=seeds, extras=extras,
                seeded_rows=self.seeded_rows)))
        add_time(timings, "generation_student", clock(self.device) - start)
        add_time(timings, "generated_micro_batches/student", len(on_policy))
        outputs = iter(samples)
        return {i: [next(outputs) for _ in groups[i]] for i in on_policy}

    def _conversations(self, loop: ToolLoop, step: int, prompts: list[list[int]], rows: list[Example], extras: list,
                       with_student: WithModel, loop_metrics_into: Metrics) -> list[Sample]:
        """The student's rollouts as conversations (the tool-call loop), one sample per prompt: its trained mask, the
        prompt followed (with an environment's observation) and its layout. Each turn samples with its own per-row
        seeds, so a row's conversation does not depend on which other rows are still going. The engine may keep each
        conversation between its turns (`ConversationCache`: the lean loop appends a turn's new ids instead of
        re-encoding the conversation); the cache goes with the rollout."""
        sampling = self.settings.student_sampling
        cache = ConversationCache()

        def generate(batch: list[list[int]], max_new_tokens: int, turn: int, rows: list[int]) -> list[Sample]:
            seeds = self.seeds(step, len(prompts), "student" if turn == 0 else f"student turn {turn}")
            return cast(list[Sample], with_student(lambda student: generate_completions(
                student, batch, replace(sampling, max_new_tokens=max_new_tokens), self.eos_ids, self.pad_id,
                self.device, vocab_size=self.vocab_size, with_log_probs=self.settings.record_log_probs,
                seeds=[seeds[r] for r in rows], extras=[extras[r] for r in rows], seeded_rows=self.seeded_rows,
                conversations=cache, conversation_keys=rows)))

        depth = self.settings.depth_curriculum
        max_turns = None if depth is None else depth.max_turns(step, loop.settings.max_turns)
        guide = self._guide(step, rows, extras)
        try:
            trajectories, followed = loop.run(generate, prompts, rows, self.eos_ids, guide, max_turns)
        finally:
            cache.state = None
        add_loop_metrics(loop_metrics_into, trajectories)
        n = float(len(trajectories))
        if self.settings.guided_turns is not None:
            add_metrics(loop_metrics_into, {"tools/guidance_probability": (self.settings.guided_turns.probability(step) * n, n)})
        if max_turns is not None:
            add_metrics(loop_metrics_into, {"tools/max_turns": (max_turns * n, n)})
        return [t.sample(prompt) for t, prompt in zip(trajectories, followed)]

    def _guide(self, step: int, rows: list[Example], extras: list) -> Guide | None:
        """Guided-OPD's guide of `step` (None when off, or when its probability has reached 0): the teacher writes the
        turns `distill.seeds.guided_turn_draw` gives it, each row keyed by its place among the step's rows over all
        processes, sampling from the teacher's sampling settings with a seed of (seed, turn, step, that place)."""
        guided, teacher = self.settings.guided_turns, self.teacher
        if guided is None or guided.probability(step) <= 0.0:
            return None
        assert teacher is not None  # checked at construction
        places = on_policy_rows(self.schedule, step, self.schedule.sampler.first_row)
        seed, sampling = self.settings.seed, self.settings.teacher_sampling

        def generate(batch: list[list[int]], max_new_tokens: int, turn: int, chosen: list[int]) -> list[Sample]:
            seeds = [row_seed(seed, f"guided teacher turn {turn}", step, places[r]) for r in chosen]
            samples = teacher.generate(batch, replace(sampling, max_new_tokens=max_new_tokens),
                                       examples=[rows[r] for r in chosen], seeds=seeds, extras=[extras[r] for r in chosen],
                                       seeded_rows=self.seeded_rows)
            return [replace(sample, log_probs=None) for sample in samples]

        return Guide(generate, lambda turn, chosen: guided.teacher_writes(seed, step, [places[r] for r in chosen], turn),
                     guided.trained)


def add_time(timings: dict[str, float], name: str, seconds: float) -> None:
    timings[name] = timings.get(name, 0.0) + seconds


def add_loop_metrics(into: Metrics, trajectories) -> None:
    """The tool-call loop's metrics of `trajectories` added to `into` (name -> (numerator, denominator))."""
    add_metrics(into, loop_metrics(trajectories))


def add_metrics(into: Metrics, metrics: Metrics) -> None:
    """`metrics` added to `into`, numerators and denominators summed (name -> (numerator, denominator))."""
    for name, (numerator, denominator) in metrics.items():
        had = into.get(name, (0.0, 0.0))
        into[name] = (had[0] + numerator, had[1] + denominator)


class StepRowSeeds:
    """Seeds keyed by the row's place among the step's rows over all processes, from `first_row` (this process's first
    row): the same sample however the rows are split (the asynchronous producer)."""

    def __init__(self, schedule: RolloutSchedule, seed: int, first_row: int):
        self.schedule, self.seed, self.first_row = schedule, seed, first_row

    def __call__(self, step: int, count: int, purpose: str) -> list[int]:
        offsets = on_policy_rows(self.schedule, step, self.first_row)
        if len(offsets) != count:
            raise RuntimeError(f"step {step}: {count} rows to sample, {len(offsets)} on-policy rows in its micro-batches")
        return [row_seed(self.seed, f"{purpose} ahead", step, row) for row in offsets]


def on_policy_rows(schedule: RolloutSchedule, step: int, first_row: int) -> list[int]:
    """The places, among `step`'s rows over all processes, of this process's on-policy rows in order (`first_row`:
    this process's first row): the same for a row however the step's rows are split."""
    offsets: list[int] = []
    offset = first_row
    for source, group in zip(schedule.sources(step), schedule.prompt_groups(step)):
        if source == "student":
            offsets.extend(range(offset, offset + len(group)))
        offset += len(group)
    return offsets
