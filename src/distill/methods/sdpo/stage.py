"""The reward stage of a group RL step (sdpo, and grpo as its special case), between rollout and loss.

It runs once per rollout, on every process at once (`distill.training.plan.StepStage`):

  1. each process scores its own completions with the reward functions (`distill.methods.sdpo.rewards`); a failure on
     any process stops every process with the `RewardFunctionError` (the trainer checkpoints first). A conversation
     (the tool-call loop's) is scored on its last model turn (the answer, not a tool result that holds it), plus its
     environment's own reward when the environment defines `get_reward`; one trained in pieces (its template
     re-renders its history) is one rollout, its advantage and reprompt given to every piece;
  2. the rewards and completion ids of the whole step are gathered from every process (one all-gather),
     so a group spread over micro-batches and processes is whole everywhere (`StepSampler`: global row r is
     in group r // G);
  3. advantages A = (r - mean of the group) / (std + 1e-4), with std the group's (advantage_scaling
     'group'), the whole step's ('batch'), or no division ('none'); std is the sample standard deviation
     (n - 1), as in the reference library;
  4. demonstrations: each rollout's first sibling, in the step's order, with reward >= success_reward_threshold
     (itself excluded unless demonstration_from_self; a conversation's whole transcript, its tool results as
     `<tool_response>` blocks); feedback is the row's `feedback` column, else its
     `privileged_context`, used with include_feedback (only when no sibling succeeded, with
     feedback_only_without_solution); `<think>...</think>` is cut from demonstrations on request;
  5. the self-teacher's prompt of each row with a demonstration or feedback (`distill.methods.sdpo.reprompts.Reprompts`);
     the other rows get no distillation loss (the self-teacher's `DISTILLED` annotation False).

All of it is a function of the step's completions, so a resumed run re-stages a restored rollout exactly.
Metrics are count-weighted across processes: per rollout (each process adds its rows), per group (the
process holding a group's first row adds it), per step (the main process adds the step's value once).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch

from distill.batch import Annotation, Completion, MicroBatch, by_row
from distill.data import Example
from distill.errors import RewardFunctionError
from distill.methods.sdpo.reprompts import Reprompts
from distill.methods.sdpo.rewards import Rewards
from distill.methods.self_teacher_prompts import shows_something
from distill.teachers.self_teacher import DISTILLED, TEACHER_PROMPT

logger = logging.getLogger(__name__)

ADVANTAGE_SCALINGS = ("group", "batch", "none")
ADVANTAGE_EPSILON = 1e-4
THINKING = re.compile(r"<think>.*?</think>", re.DOTALL)
STEP_METRICS = ("reward/mean", "reward/std", "reward/group_std", "sdpo/success_group_fraction",
                "sdpo/equal_reward_group_fraction", "sdpo/success_sample_fraction", "sdpo/feedback_fraction",
                "sdpo/reprompt_sample_fraction")

ADVANTAGE: Annotation[float] = Annotation("advantage")  # a row's group-relative advantage (sdpo's own state)


def function_metrics(names: list[str]) -> list[str]:
    """Each reward function's own mean and std (by its name: a built-in's, or the import path)."""
    return [f"reward/{name}/{kind}" for name in names for kind in ("mean", "std")]


@dataclass(frozen=True)
class GroupSettings:
    generations: int
    scaling: str = "group"
    threshold: float = 1.0
    demonstration_from_self: bool = False
    include_feedback: bool = False
    feedback_only_without_solution: bool = False
    remove_thinking: bool = False


def group_advantages(rewards: torch.Tensor, generations: int, scaling: str) -> torch.Tensor:
    """(R,) float64 advantages of (R,) rewards in groups of `generations` consecutive rows."""
    if scaling not in ADVANTAGE_SCALINGS:
        raise ValueError(f"advantage_scaling must be one of {ADVANTAGE_SCALINGS}, got {scaling!r}")
    grouped = rewards.double().reshape(-1, generations)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scaling == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + ADVANTAGE_EPSILON)
    elif scaling == "batch":
        centred = centred / (rewards.double().std() + ADVANTAGE_EPSILON)
    return centred.reshape(-1)


def demonstration_rows(rewards: torch.Tensor, generations: int, threshold: float, from_self: bool) -> list[int | None]:
    """For each row, the first row of its group (in order) with reward >= threshold, itself excluded unless
    `from_self`; None when there is none."""
    success = (rewards >= threshold).tolist()
    chosen = []
    for i in range(len(success)):
        start = i - i % generations
        chosen.append(next((j for j in range(start, start + generations) if success[j] and (from_self or j != i)), None))
    return chosen


class _Throttle:
    """Logs a recurring warning at its 1st, 10th, 100th, ... occurrence, with the count."""

    def __init__(self) -> None:
        self.count, self.next = 0, 1

    def __call__(self, message: str) -> None:
        self.count += 1
        if self.count == self.next:
            logger.warning("%s (occurrence %d; logged at the 1st, 10th, 100th, ...)", message, self.count)
            self.next *= 10


class RewardStage:
    """Rewards, advantages, demonstrations and reprompts of a step's rollout (module docstring).

    reprompts: None when nothing is distilled (distillation_weight 0: GRPO), else the teacher prompts.
    runtime: `distill.training.runtime.Runtime` (agree, gather_objects, process facts); first_row: this process's
    first global row (`StepSampler.first_row`)."""

    def __init__(self, rewards: Rewards, settings: GroupSettings, reprompts: Reprompts | None, tokenizer, runtime,
                 first_row: int):
        self.rewards, self.settings, self.reprompts, self.tokenizer = rewards, settings, reprompts, tokenizer
        self.runtime, self.first_row = runtime, first_row
        self._no_success, self._equal_groups = _Throttle(), _Throttle()

    def metric_names(self) -> list[str]:
        return [*STEP_METRICS, *function_metrics(self.rewards.names)]

    def __call__(self, step: int, micro_batches: list[MicroBatch]) -> dict[str, tuple[float, float]]:
        pieces = [c for mb in micro_batches for c in mb.completions]
        rows = by_row(pieces)  # a conversation trained in pieces is one rollout: rewarded on its last piece's answer
        completions = [row[-1] for row in rows]
        values = self._local_rewards(completions)
        gathered = self.runtime.gather_objects((values.tolist(), [self._demonstration(row) for row in rows]))
        all_values = torch.tensor([row for part, _ in gathered for row in part], dtype=torch.float64)
        all_values = all_values.reshape(-1, len(self.rewards.names))
        all_texts = [text for _, part in gathered for text in part]
        s = self.settings
        total = self.rewards.total(all_values)
        advantages = group_advantages(total, s.generations, s.scaling)
        demonstrations = demonstration_rows(total, s.generations, s.threshold, s.demonstration_from_self)
        local = range(self.first_row, self.first_row + len(completions))
        used_feedback = [any([self._annotate(c, float(advantages[r]), demonstrations[r], all_texts) for c in row])
                         for row, r in zip(rows, local)]
        for mb in micro_batches:  # the policy gradient's row weights (every piece of a rollout its advantage)
            mb.advantages = torch.tensor([ADVANTAGE.of(c) for c in mb.completions], dtype=torch.float32)
        self._warn(step, total)
        return self._metrics(all_values, total, [row[0] for row in rows], local, demonstrations, used_feedback)

    # ------------------------------------------------------------------------------------------ parts --
    def _local_rewards(self, completions: list[Completion]) -> torch.Tensor:
        """(n, K) this process's reward values; any process failing stops all of them."""
        examples = [_example(c) for c in completions]
        texts = [self._decode(c.completion_ids if c.layout is None else c.layout.final_turn(c.completion_ids))
                 for c in completions]
        environment = [None if c.layout is None else c.layout.reward for c in completions]
        values, error = None, None
        try:
            values = self.rewards([e.prompt for e in examples], texts, [e.row for e in examples], [e.index for e in examples],
                                  environment)
        except RewardFunctionError as failure:
            error = failure
        except Exception as failure:  # anything else: the other processes must still learn of it, not wait here
            error = RewardFunctionError(f"scoring the rewards failed: {type(failure).__name__}: {failure}")
            error.__cause__ = failure
        if self.runtime.agree([error is not None])[0]:
            raise error or RewardFunctionError("a reward function failed on another process (its error is in that process's log)")
        return values

    def _demonstration(self, row: list[Completion]) -> str:
        """What a sibling shows as a demonstration: its completion's text, or a conversation's transcript (its pieces'
        in order, each holding turns the others do not)."""
        if row[0].layout is None:
            return self._decode(row[0].completion_ids)
        return "\n".join(c.layout.transcript(c.completion_ids, self._decode) for c in row if c.layout is not None)

    def _annotate(self, completion: Completion, advantage: float, demonstration: int | None, all_texts: list[str]) -> bool:
        """Annotate the completion with its advantage and, for the self-teacher, whether it is distilled and
        its teacher prompt (the reprompt); returns whether its reprompt shows feedback."""
        s, example = self.settings, _example(completion)
        ADVANTAGE.put(completion, advantage)
        feedback = example.feedback if example.feedback is not None else example.privileged_context
        use_feedback = (s.include_feedback and feedback is not None and shows_something(feedback)
                        and not (s.feedback_only_without_solution and demonstration is not None))
        distilled = self.reprompts is not None and (demonstration is not None or use_feedback)
        DISTILLED.put(completion, distilled)
        reprompt = None
        if distilled:
            text = None if demonstration is None else all_texts[demonstration]
            if text is not None and s.remove_thinking:
                text = THINKING.sub("", text).strip()
            observation = None if completion.layout is None else completion.layout.observation
            assert self.reprompts is not None  # `distilled` implies them
            history = () if completion.layout is None else completion.layout.history
            reprompt = self.reprompts.ids(example, text, feedback if use_feedback else None, observation, history)
        TEACHER_PROMPT.put(completion, reprompt)
        return distilled and use_feedback

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _warn(self, step: int, total: torch.Tensor) -> None:
        if not self.runtime.is_main_process:
            return
        s = self.settings
        if not bool((total >= s.threshold).any()):
            self._no_success(f"step {step}: no rollout reached success_reward_threshold {s.threshold} (rewards "
                             f"{float(total.min()):.3g} to {float(total.max()):.3g}): no demonstration to distil; check "
                             "the reward functions or the threshold")
        grouped = total.reshape(-1, s.generations)
        equal = int((grouped == grouped[:, :1]).all(dim=1).sum())
        if equal:
            self._equal_groups(f"step {step}: {equal} of {grouped.shape[0]} groups have all rewards equal (advantage 0: "
                               "no policy gradient from them)")

    def _metrics(self, all_values, total, completions, local, demonstrations, used_feedback) -> dict[str, tuple[float, float]]:
        s, n = self.settings, float(len(completions))
        rows = list(local)
        metrics = {"reward/mean": (float(total[rows].sum()), n),
                   "sdpo/success_sample_fraction": (float(sum(demonstrations[r] is not None for r in rows)), n),
                   "sdpo/feedback_fraction": (float(sum(used_feedback)), n),
                   "sdpo/reprompt_sample_fraction": (float(sum(DISTILLED.of(c) for c in completions)), n)}
        for k, name in enumerate(self.rewards.names):
            metrics[f"reward/{name}/mean"] = (float(all_values[rows, k].sum()), n)
        once = 1.0 if self.runtime.is_main_process else 0.0  # the step's values, counted once over all processes
        metrics["reward/std"] = (once * float(total.std()) if len(total) > 1 else 0.0, once)
        for k, name in enumerate(self.rewards.names):
            metrics[f"reward/{name}/std"] = (once * float(all_values[:, k].std()) if len(total) > 1 else 0.0, once)
        grouped = total.reshape(-1, s.generations)
        owned = [g for g in range(grouped.shape[0]) if g * s.generations in local]
        group_std = grouped.std(dim=1)
        metrics["reward/group_std"] = (float(group_std[owned].sum()), float(len(owned)))
        metrics["sdpo/success_group_fraction"] = (float((grouped[owned] >= s.threshold).any(dim=1).sum()), float(len(owned)))
        metrics["sdpo/equal_reward_group_fraction"] = (float((grouped[owned] == grouped[owned, :1]).all(dim=1).sum()),
                                                       float(len(owned)))
        return metrics


def _example(completion: Completion) -> Example:
    """The dataset row a completion answers (every rollout sdpo stages samples dataset rows)."""
    assert completion.example is not None
    return completion.example
