"""Completion sources and the rollout of a whole optimizer step.

Every micro-batch of an optimizer step gets one source, drawn before anything is generated:
    "student": the student samples (on-policy)          probability lmbda
    "dataset": the dataset's own completion              otherwise, without seq_kd
    "teacher": the teacher samples (sequence-level KD)   otherwise, with seq_kd
The draw depends only on (seed, step, micro-batch), so every process makes the same choice without
communicating, and a resumed run makes the same choices as an uninterrupted one.

How each micro-batch draws its source is the method's choice: a `SourcePlan` (GKD's lmbda mix in
`distill.methods.mixing`). Generation is batched per source over the whole step (all of this process's
micro-batches at once): the student generates once, the teacher once, and only for the micro-batches that
use their output (`StepRollout`).

The rollout producer. The trainer asks for the rollout of step k (`RolloutProducer.request`) and takes it when
step k trains (`take`); between the two a producer may generate ahead (`distill.training.ahead.AheadRollout`, with
`max_staleness`: a worker thread, within the bound) or not at all (`StepRollout`, synchronous: it generates in `take`). Every student-sampled completion
records the weights version that sampled it (`Completion.weights_version`: the optimizer steps applied to the
student when it sampled), and a micro-batch's staleness is the trained version minus the oldest of its rows'
(`MicroBatch.staleness`). Objectives read that integer: 0 means the sampling policy is the one being trained.
Rollout reuse (`num_iterations`) is a producer's reuse window: steps k .. k + num_iterations - 1 take the
rollout sampled at step k, at staleness 0 .. num_iterations - 1. What a producer holds between steps (a
reused rollout) it checkpoints itself, as a step hook (`state_dict`).

Rollout log-probs. A method that asks for them (`Method.needs_rollout_log_probs`) gets, for every sampled
token, its log-prob under the distribution it was actually drawn from: the student's logits divided by
`sampling_temperature`, then top-k and top-p filtering, renormalised (transformers' processed scores; the
sampled token is never one that filtering removed, so the value is finite). With top_k 0 and top_p 1 that
is log softmax(logits / sampling_temperature). Dataset and teacher completions have none (None).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Callable, Protocol, cast

import torch

from distill.batch import Completion, MicroBatch, collate, skipping_first, untrained
from distill.conversations.layout import Layout
from distill.conversations.loop import LOOP_METRICS, ToolLoop, loop_metrics
from distill.data import EncodedExample, Example, StepSampler
from distill.generation import SamplingParams, generate_completions
from distill.generation.seeds import row_seeds
from distill.training.runtime import phase_clock

logger = logging.getLogger(__name__)

SOURCES = ("student", "dataset", "teacher")
# An asynchronous producer's timers (logged as time/NAME, seconds per step): copying the weights of a new version and
# loading (pushing) them where the student samples, the training thread waiting for a rollout, the worker sampling it,
# the training thread from taking a rollout to its optimizer step.
ASYNC_TIMERS = ("weight_push", "queue_wait", "generation", "training")


class SourcePlan(Protocol):
    """Which completion source each micro-batch of a step uses (a method's choice)."""

    def draw(self, seed: int, step: int, num_micro_batches: int) -> list[str]:
        """The sources of step `step`'s micro-batches; identical on every process."""

    def logged(self, step: int) -> dict[str, float]:
        """What the plan logs for `step` (GKD's mix: its lmbda, the probability of an on-policy micro-batch)."""

    def possible(self) -> frozenset[str]:
        """Every source some step can draw."""


@dataclass
class RolloutSettings:
    """What the step rollout needs from the config."""

    student_sampling: SamplingParams
    teacher_sampling: SamplingParams
    seq_kd_generation_steps: int
    max_steps: int
    seed: int
    record_log_probs: bool
    num_iterations: int = 1
    loss_skip: int = 0  # num_loss_tokens_to_skip
    trains_row: Callable[[Example], bool] | None = None  # the method's; None: every row trains
    tool_loop: ToolLoop | None = None  # `tools`: the student's rollouts are conversations (`distill.conversations.loop`)


class StepStage(Protocol):
    """A method's work on a whole step's rollout before any loss (sdpo: rewards, advantages, demonstrations).

    Called once per rollout (a reused rollout is staged once; a restored one again, so the stage must be
    a function of the completions) with the step and this process's micro-batches, on every process at
    once (it may use collectives). It sets the completions' `advantage` / `reprompt` / `distilled` and
    returns metrics: name -> (numerator, denominator), reduced across processes like every metric."""

    def metric_names(self) -> list[str]: ...

    def __call__(self, step: int, micro_batches: list["MicroBatch"]) -> dict[str, tuple[float, float]]: ...


class RolloutProducer(ABC):
    """The seam between generating a step's rollout and training on it (module docstring).

    The trainer calls `request(k)` and then `take(k)` for every step k in order, on every process at once.
    A producer is a step hook (`distill.methods.registry.StepHook`): its `state_dict` holds what it must
    carry over a resume (plain values), `holds_state` says whether it holds anything at all.
    """

    name = "rollout"
    seeded_rows = False  # the built-in engines sample on torch's process RNG (an asynchronous producer: per-row seeds)

    @abstractmethod
    def request(self, step: int) -> None:
        """Step `step` will train next: a producer may start its rollout (or those after it) now."""

    @abstractmethod
    def take(self, step: int, timings: dict[str, float]) -> list["MicroBatch"]:
        """This process's micro-batches of step `step`, each completion with the weights version that sampled it."""

    @abstractmethod
    def sources(self, step: int) -> list[str]:
        """The completion source of each micro-batch of step `step`."""

    @abstractmethod
    def generations(self, steps: int) -> int:
        """Rollouts generated in the first `steps` optimizer steps (each takes a fresh batch of prompts)."""

    @abstractmethod
    def generation_step(self, step: int) -> int:
        """The step whose rollout `step` trains on."""

    def take_stage_metrics(self) -> dict[str, tuple[float, float]]:
        """The method's step-stage metrics (and the tool-call loop's) of the rollout made since the last call."""
        return {}

    def take_producer_metrics(self) -> dict[str, tuple[float, float]]:
        """An asynchronous producer's timers ("time/NAME") and drops ("staleness/dropped") since the last call: name ->
        (sum, steps counted)."""
        return {}

    def metric_names(self) -> tuple[str, ...]:
        """The names `take_stage_metrics` may give (every process registers them)."""
        return ()

    def holds_state(self) -> bool:
        """Whether the producer holds something between steps that a checkpoint must keep."""
        return False

    def start(self, step: int) -> None:
        """Training starts (or resumes) at `step`, with the student's weights of that version."""

    def close(self) -> None:
        """Training ended (or failed): stop whatever runs beside it."""

    def restore_point(self) -> dict:
        """What `load_state_dict` needs to undo a step that failed (the trainer takes it before each step)."""
        return self.state_dict()

    def after_optimizer_step(self, step: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class StepRollout(RolloutProducer):
    """The synchronous producer: completions for every micro-batch of this process, generated when a step takes them.

    One student `generate` for the step's on-policy micro-batches, one teacher `generate` per window of
    `seq_kd_generation_steps` steps for the seq_kd ones, dataset completions for the rest.

    With `num_iterations` > 1 the micro-batches of step k * num_iterations (prompts, completions, their
    sampling log-probs and weights version) are reused by the next num_iterations - 1 steps. The reused
    rollout is what this producer holds: checkpointed (`state_dict`), so a run resumed inside a reuse window
    trains on the same samples.
    """

    def __init__(self, plan: SourcePlan, sampler: StepSampler, examples: list[Example], encoded: list[EncodedExample],
                 settings: RolloutSettings, with_student: Callable[[Callable], object], teacher, eos_ids: list[int],
                 pad_id: int, vocab_size: int, device: torch.device, process_index: int, stage: StepStage | None = None):
        """`with_student(run)`: `run(student)` with the student as it is now (gathered first under FSDP; every
        process generates at the same steps, since the source plan is the same on all of them). `stage`: the
        method's work on each rollout before any loss (sdpo's rewards), or None."""
        self.plan, self.sampler, self.examples, self.encoded, self.settings = plan, sampler, examples, encoded, settings
        self.with_student, self.teacher = with_student, teacher
        self.eos_ids, self.pad_id, self.vocab_size, self.device, self.process_index = eos_ids, pad_id, vocab_size, device, process_index
        self._teacher_window: tuple[int, dict] | None = None
        self._reused: tuple[int, list[MicroBatch]] | None = None
        self.stage = stage
        self._staged: int | None = None  # the generation step whose rollout the stage has seen
        self._restored = False  # the reused rollout came from a checkpoint (its stage metrics are logged already)
        self.stage_metrics: dict[str, tuple[float, float]] = {}  # the last stage's, taken by the trainer
        self.loop_metrics: dict[str, tuple[float, float]] = {}  # the tool-call loop's, of the last rollout generated

    def sources(self, step: int) -> list[str]:
        return self.plan.draw(self.settings.seed, self.generation_step(step), self.sampler.accumulation)

    def generation_step(self, step: int) -> int:
        """The step whose rollout `step` trains on (itself unless rollouts are reused)."""
        return step - step % self.settings.num_iterations

    def generations(self, steps: int) -> int:
        """Rollouts generated in the first `steps` optimizer steps (each takes a fresh batch of prompts)."""
        return -(-steps // self.settings.num_iterations)

    def prompt_groups(self, step: int) -> list[list[int]]:
        """The prompts of each micro-batch of `step`'s rollout: the sampler's batch of the rollout's index, so
        that reuse skips no prompt of an epoch."""
        return self.sampler.micro_batch_indices(self.generation_step(step) // self.settings.num_iterations)

    def request(self, step: int) -> None:
        pass  # synchronous: the rollout is generated when the step takes it

    def take(self, step: int, timings: dict[str, float]) -> list[MicroBatch]:
        first = self.generation_step(step)
        if self._reused is not None and self._reused[0] == first:
            micro_batches = self._reused[1]
        else:
            micro_batches = self._generate(first, timings)
            self._staged, self._restored = None, False
            if self.settings.num_iterations > 1:
                self._reused = (first, micro_batches)
        self._run_stage(first, micro_batches, timings)
        return micro_batches

    def _run_stage(self, first: int, micro_batches: list[MicroBatch], timings: dict[str, float]) -> None:
        """The method's step stage on the rollout of step `first`, once per rollout."""
        if self.stage is not None and self._staged != first:
            start = phase_clock(self.device)
            metrics = self.stage(first, micro_batches)
            # A rollout restored from a checkpoint was staged before the interruption, its metrics added to a
            # window then (logged, or lost with the window's other metrics if the run stopped before the log).
            self.stage_metrics = {} if self._restored else metrics
            self._staged, self._restored = first, False
            _add(timings, "stage", phase_clock(self.device) - start)

    def take_stage_metrics(self) -> dict[str, tuple[float, float]]:
        metrics, self.stage_metrics = {**self.stage_metrics, **self.loop_metrics}, {}
        self.loop_metrics = {}
        return metrics

    def metric_names(self) -> tuple[str, ...]:
        stage = tuple(self.stage.metric_names()) if self.stage is not None else ()
        return stage + (LOOP_METRICS if self.settings.tool_loop is not None else ())

    # ----------------------------------------------------------------------- the reused rollout as a hook --
    def holds_state(self) -> bool:
        return self.settings.num_iterations > 1

    def state_dict(self) -> dict:
        """The reused rollout's completions (token ids, hit-max flags, sampling log-probs, weights version),
        plain values only; prompts and sources follow from the step."""
        if self._reused is None:
            return {}
        first, batches = self._reused
        return {"step": first, "batches": [[{"ids": list(c.completion_ids), "hit_max": bool(c.hit_max_new_tokens),
                                             "log_probs": c.rollout_log_probs, "version": c.weights_version,
                                             "trained": [bool(flag) for flag in c.mask], "prompt": list(c.prompt_ids),
                                             "layout": None if c.layout is None else c.layout.to_plain()}
                                            for c in mb.completions] for mb in batches]}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            self._reused, self._staged = None, None
            return
        first = int(state["step"])
        groups, sources = self.prompt_groups(first), self.sources(first)
        if [len(g) for g in groups] != [len(saved) for saved in state["batches"]]:
            raise ValueError(f"resume: the checkpoint's reused rollout (step {first}) has micro-batches of "
                             f"{[len(saved) for saved in state['batches']]} prompts, this run {[len(g) for g in groups]}; "
                             "resume with the run's per_device_train_batch_size and gradient_accumulation_steps")
        batches = []
        for source, group, saved in zip(sources, groups, state["batches"]):
            # A checkpoint from before weights versions were recorded: the student sampled at the rollout's step.
            completions = [self._completion(j, source, list(c["ids"]), bool(c["hit_max"]),
                                            None if c["log_probs"] is None else [float(v) for v in c["log_probs"]],
                                            c.get("version", first if source == "student" else None),
                                            None if source == "dataset" or "trained" not in c else tuple(c["trained"]),
                                            None if "prompt" not in c else [int(t) for t in c["prompt"]],
                                            Layout.from_plain(c["layout"]) if c.get("layout") else None)
                           for j, c in zip(group, saved)]
            batches.append(collate(completions, source, self.pad_id))
        self._reused = (first, batches)
        self._staged = None  # restored completions are staged again (rewards, demonstrations) when first used
        self._restored = True

    # --------------------------------------------------------------------------------------- generation --
    def _generate(self, step: int, timings: dict[str, float]) -> list[MicroBatch]:
        outputs = self._student_outputs(step, self.with_student, timings, self.loop_metrics)
        return self._assemble(step, outputs, step, timings)

    def _student_seeds(self, step: int, count: int, purpose: str) -> list[int]:
        """One sampling seed per on-policy row of `step` (`purpose`: "student", or a later turn's)."""
        return row_seeds(count, self.settings.seed, purpose, step, self.process_index)

    def _student_outputs(self, step: int, with_student: Callable[[Callable], object], timings: dict[str, float],
                         loop_metrics: dict[str, tuple[float, float]], clock: Callable[[torch.device], float] = phase_clock,
                         ) -> dict[int, list[tuple]]:
        """The student's samples of `step`'s on-policy micro-batches, by micro-batch index: per row (ids, hit max,
        sampling log-probs or nothing, and a conversation's trained mask, prompt followed and layout), sampled by
        the model `with_student` runs (the student as it is now, or the asynchronous producer's copy); `clock`
        times it (a worker thread's must not wait for the training thread's kernels)."""
        sources = self.sources(step)
        groups = self.prompt_groups(step)
        on_policy = [i for i, s in enumerate(sources) if s == "student"]
        if not on_policy:
            return {}
        prompts = [self.encoded[j].prompt_ids for i in on_policy for j in groups[i]]
        extras = [self.encoded[j].extras for i in on_policy for j in groups[i]]
        start = clock(self.device)
        seeds = self._student_seeds(step, len(prompts), "student")
        if self.settings.tool_loop is not None:
            rows = [self.examples[j] for i in on_policy for j in groups[i]]
            outputs = iter(self._conversations(self.settings.tool_loop, step, prompts, rows, extras, with_student,
                                               loop_metrics))
        else:
            outputs = iter(with_student(lambda student: generate_completions(
                student, prompts, self.settings.student_sampling, self.eos_ids, self.pad_id, self.device,
                vocab_size=self.vocab_size, with_log_probs=self.settings.record_log_probs, seeds=seeds, extras=extras,
                seeded_rows=self.seeded_rows)))
        _add(timings, "generation_student", clock(self.device) - start)
        _add(timings, "generated_micro_batches/student", len(on_policy))
        return {i: [next(outputs) for _ in groups[i]] for i in on_policy}

    def _assemble(self, step: int, generated: dict[int, list[tuple]], version: int,
                  timings: dict[str, float]) -> list[MicroBatch]:
        """`step`'s micro-batches: the student's samples `generated` (drawn by the weights of `version`), the teacher's
        (sampled here, a window at a time) and the dataset's completions."""
        sources = self.sources(step)
        groups = self.prompt_groups(step)
        generated = dict(generated)
        if "teacher" in sources:
            window = self._teacher_samples(step, timings)
            generated.update({i: window[(step, i)] for i, s in enumerate(sources) if s == "teacher"})
        micro_batches = []
        for i, (source, group) in enumerate(zip(sources, groups)):
            completions = []
            for position, j in enumerate(group):
                log_probs = None
                if source == "dataset":
                    ids = list(self.encoded[j].completion_ids)
                    cut = self.encoded[j].completion_cut
                    hit_max = cut if self.encoded[j].completion_trained is not None else bool(ids) and ids[-1] not in self.eos_ids
                    trained = prompt = layout = None
                else:
                    ids, hit_max, *rest = generated[i][position]
                    log_probs = rest[0] if rest else None
                    trained = rest[1] if len(rest) > 1 else None  # a conversation's: the environment's ids untrained
                    prompt = rest[2] if len(rest) > 2 else None  # with an environment's observation
                    layout = rest[3] if len(rest) > 3 else None  # a conversation's turns
                completions.append(self._completion(j, source, ids, hit_max, log_probs, version if source == "student" else None,
                                                    trained, prompt, layout))
            micro_batches.append(collate(completions, source, self.pad_id))
        return micro_batches

    def _completion(self, j: int, source: str, ids: list[int], hit_max: bool, log_probs: list[float] | None,
                    weights_version: int | None, trained: tuple[bool, ...] | None = None,
                    prompt_ids: list[int] | None = None, layout: Layout | None = None) -> Completion:
        """Example `j`'s completion `ids`, with what the method trains of it; `weights_version`: the student
        weights that sampled it (the optimizer steps applied when it was sampled), None for another source;
        `trained`: a sampled conversation's own mask (its sampled turns), None for a completion sampled whole;
        `prompt_ids`: the prompt it followed, when not the row's own (an environment's observation appended);
        `layout`: a sampled conversation's model and environment segments (a dataset conversation's are the row's)."""
        trains_row = self.settings.trains_row
        mask = (skipping_first(len(ids), self.settings.loss_skip) if trains_row is None or trains_row(self.examples[j])
                else untrained(len(ids)))
        conversation = self.encoded[j].completion_trained if source == "dataset" else trained
        if conversation is not None:  # a conversation's own turns: only the assistant's trained
            mask = tuple(a and b for a, b in zip(mask, conversation))
        prompt = self.encoded[j].prompt_ids if prompt_ids is None else prompt_ids
        if source == "dataset":
            layout = self.encoded[j].completion_layout
        return Completion(prompt, ids, source, hit_max, self.encoded[j].prompt_truncated,
                          self.examples[j], log_probs, mask, weights_version, extras=self.encoded[j].extras, layout=layout)

    def _conversations(self, loop: ToolLoop, step: int, prompts: list[list[int]], rows: list[Example], extras: list,
                       with_student: Callable[[Callable], object], loop_metrics: dict[str, tuple[float, float]],
                       ) -> list[tuple[list[int], bool, list[float] | None, tuple[bool, ...], list[int], Layout]]:
        """The student's rollouts as conversations (the tool-call loop): per prompt (ids, hit max, sampling log-probs,
        trained mask, the prompt followed: with an environment's observation, the layout). Each turn samples with its own
        per-row seeds, so a row's conversation does not depend on which other rows are still going."""
        sampling = self.settings.student_sampling

        def generate(batch: list[list[int]], max_new_tokens: int, turn: int, rows: list[int]):
            seeds = self._student_seeds(step, len(prompts), "student" if turn == 0 else f"student turn {turn}")
            outputs = cast(list, with_student(lambda student: generate_completions(
                student, batch, replace(sampling, max_new_tokens=max_new_tokens), self.eos_ids, self.pad_id,
                self.device, vocab_size=self.vocab_size, with_log_probs=self.settings.record_log_probs,
                seeds=[seeds[r] for r in rows], extras=[extras[r] for r in rows], seeded_rows=self.seeded_rows)))
            return [(ids, hit_max, rest[0] if rest else None) for ids, hit_max, *rest in outputs]

        trajectories, followed = loop.run(generate, prompts, rows, self.eos_ids)
        _add_loop_metrics(loop_metrics, trajectories)
        return [(t.ids, t.hit_max, t.log_probs, tuple(t.trained), prompt, t.layout) for t, prompt in zip(trajectories, followed)]

    def _teacher_conversations(self, loop: ToolLoop, first: int, prompts: list[list[int]], examples: list[Example],
                               extras: list) -> list[tuple[list[int], bool, None, tuple[bool, ...], list[int], Layout]]:
        """The teacher's samples as conversations (the tool-call loop), as `_conversations` makes the student's; no
        sampling log-probs (nothing reads a teacher's)."""
        sampling = self.settings.teacher_sampling

        def generate(batch: list[list[int]], max_new_tokens: int, turn: int, rows: list[int]):
            seeds = row_seeds(len(prompts), self.settings.seed, "teacher" if turn == 0 else f"teacher turn {turn}", first,
                              self.process_index)
            outputs = self.teacher.generate(batch, replace(sampling, max_new_tokens=max_new_tokens),
                                            examples=[examples[r] for r in rows], seeds=[seeds[r] for r in rows],
                                            extras=[extras[r] for r in rows])
            return [(ids, hit_max, None) for ids, hit_max, *_ in outputs]

        trajectories, followed = loop.run(generate, prompts, examples, self.eos_ids)
        _add_loop_metrics(self.loop_metrics, trajectories)
        return [(t.ids, t.hit_max, None, tuple(t.trained), prompt, t.layout) for t, prompt in zip(trajectories, followed)]

    def _teacher_samples(self, step: int, timings: dict[str, float]) -> dict[tuple[int, int], list[tuple]]:
        """Teacher (seq_kd) completions for every teacher micro-batch of the window of
        `seq_kd_generation_steps` steps holding `step`, generated in one batched call.

        The teacher is frozen, so sampling ahead changes nothing but the batch size. Sampling uses its own
        RNG seeded by (seed, window), so a run resumed in the middle of a window regenerates exactly the
        same completions, and the global RNG (student sampling) is untouched.
        """
        settings = self.settings
        size = settings.seq_kd_generation_steps
        first = step - step % size
        if self._teacher_window is not None and self._teacher_window[0] == first:
            return self._teacher_window[1]
        keys = [(s, i) for s in range(first, min(first + size, settings.max_steps)) if self.generation_step(s) == s
                for i, source in enumerate(self.sources(s)) if source == "teacher"]
        groups = {s: self.prompt_groups(s) for s in {s for s, _ in keys}}
        prompts = [self.encoded[j].prompt_ids for s, i in keys for j in groups[s][i]]
        extras = [self.encoded[j].extras for s, i in keys for j in groups[s][i]]
        examples = [self.examples[j] for s, i in keys for j in groups[s][i]]
        start = phase_clock(self.device)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(settings.seed * 1_000_003 + first + 104_729 * (self.process_index + 1))
            if settings.tool_loop is not None:  # the teacher acts in the conversation too (seq_kd on tool-use tasks)
                outputs = iter(self._teacher_conversations(settings.tool_loop, first, prompts, examples, extras))
            else:
                seeds = row_seeds(len(prompts), settings.seed, "teacher", first, self.process_index)
                outputs = iter(self.teacher.generate(prompts, settings.teacher_sampling, examples=examples, seeds=seeds,
                                                     extras=extras))
        _add(timings, "generation_teacher", phase_clock(self.device) - start)
        _add(timings, "generated_micro_batches/teacher", len(keys))
        window = {(s, i): [next(outputs) for _ in groups[s][i]] for s, i in keys}
        self._teacher_window = (first, window)
        return window


def _add(timings: dict[str, float], name: str, seconds: float) -> None:
    timings[name] = timings.get(name, 0.0) + seconds


def _add_loop_metrics(into: dict[str, tuple[float, float]], trajectories) -> None:
    """The tool-call loop's metrics of `trajectories` added to `into` (name -> (numerator, denominator))."""
    for name, (numerator, denominator) in loop_metrics(trajectories).items():
        had = into.get(name, (0.0, 0.0))
        into[name] = (had[0] + numerator, had[1] + denominator)
