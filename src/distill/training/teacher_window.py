"""The teacher's (seq_kd) samples, a window of `seq_kd_generation_steps` steps at a time."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from distill.agents.loop import ToolLoop
from distill.data import EncodedExample, Example
from distill.generation.sample import Sample
from distill.seeds import row_seeds, teacher_window_seed
from distill.training.plan import RolloutSchedule, RolloutSettings
from distill.training.runtime import phase_clock
from distill.training.student_sampler import Metrics, add_loop_metrics, add_time

if TYPE_CHECKING:
    from distill.teachers.base import Teacher

WindowSamples = dict[tuple[int, int], list[Sample]]  # (step, micro-batch index) -> one sample per row


class TeacherWindow:
    """Teacher (seq_kd) completions for every teacher micro-batch of the window of `seq_kd_generation_steps` steps
    holding a step, generated in one batched call and kept until a step of another window asks.

    The teacher is frozen, so sampling ahead changes nothing but the batch size. Sampling uses its own
    RNG seeded by (seed, window), so a run resumed in the middle of a window regenerates exactly the
    same completions, and the global RNG (student sampling) is untouched.
    """

    def __init__(self, schedule: RolloutSchedule, examples: list[Example], encoded: list[EncodedExample],
                 settings: RolloutSettings, teacher: Teacher, eos_ids: list[int], device: torch.device, process_index: int):
        self.schedule, self.examples, self.encoded, self.settings = schedule, examples, encoded, settings
        self.teacher, self.eos_ids, self.device, self.process_index = teacher, eos_ids, device, process_index
        self._window: tuple[int, WindowSamples] | None = None  # (its first step, its samples)

    def samples(self, step: int, timings: dict[str, float], loop_metrics_into: Metrics) -> WindowSamples:
        """The samples of the window holding `step` (class docstring); a conversation's loop metrics are added to
        `loop_metrics_into` when the window is sampled."""
        settings, schedule = self.settings, self.schedule
        size = settings.seq_kd_generation_steps
        first = step - step % size
        if self._window is not None and self._window[0] == first:
            return self._window[1]
        keys = [(s, i) for s in range(first, min(first + size, settings.max_steps)) if schedule.generation_step(s) == s
                for i, source in enumerate(schedule.sources(s)) if source == "teacher"]
        groups = {s: schedule.prompt_groups(s) for s in {s for s, _ in keys}}
        prompts = [self.encoded[j].prompt_ids for s, i in keys for j in groups[s][i]]
        extras = [self.encoded[j].extras for s, i in keys for j in groups[s][i]]
        examples = [self.examples[j] for s, i in keys for j in groups[s][i]]
        start = phase_clock(self.device)
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(teacher_window_seed(settings.seed, first, self.process_index))
            if settings.tool_loop is not None:  # the teacher acts in the conversation too (seq_kd on tool-use tasks)
                samples = self._conversations(settings.tool_loop, first, prompts, examples, extras, loop_metrics_into)
            else:
                seeds = row_seeds(len(prompts), settings.seed, "teacher", first, self.process_index)
                samples = self.teacher.generate(prompts, settings.teacher_sampling, examples=examples, seeds=seeds,
                                                extras=extras)
        add_time(timings, "generation_teacher", phase_clock(self.device) - start)
        add_time(timings, "generated_micro_batches/teacher", len(keys))
        outputs = iter(samples)
        window = {(s, i): [next(outputs) for _ in groups[s][i]] for s, i in keys}
        self._window = (first, window)
        return window

    def _conversations(self, loop: ToolLoop, first: int, prompts: list[list[int]], examples: list[Example],
                       extras: list, loop_metrics_into: Metrics) -> list[Sample]:
        """The teacher's samples as conversations (the tool-call loop), as the student's are sampled
        (`distill.training.student_sampler`); no sampling log-probs (nothing reads a teacher's)."""
        sampling = self.settings.teacher_sampling

        def generate(batch: list[list[int]], max_new_tokens: int, turn: int, rows: list[int]) -> list[Sample]:
            seeds = row_seeds(len(prompts), self.settings.seed, "teacher" if turn == 0 else f"teacher turn {turn}", first,
                              self.process_index)
            samples = self.teacher.generate(batch, replace(sampling, max_new_tokens=max_new_tokens),
                                            examples=[examples[r] for r in rows], seeds=[seeds[r] for r in rows],
                                            extras=[extras[r] for r in rows])
            return [replace(sample, log_probs=None) for sample in samples]

        trajectories, followed = loop.run(generate, prompts, examples, self.eos_ids)
        add_loop_metrics(loop_metrics_into, trajectories)
        return [t.sample(prompt, with_log_probs=False) for t, prompt in zip(trajectories, followed)]
