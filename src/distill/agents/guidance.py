"""Curricula over the student's conversations: who writes each turn (Guided-OPD) and how many turns a conversation may
have (TCOD), as functions of the optimizer step, the row and the turn alone.

Guided-OPD (Li et al., 2026, arXiv 2606.15912): each turn of a student's training conversation is written by the
teacher instead of the student with probability p(s) at optimizer step s, decaying to 0, so early conversations stay
where the teacher's supervision is reliable and the run ends purely on-policy:

    p(s) = p_0 * max(0, 1 - s / (f * S))            p_0 = guided_turns_probability, f = guided_turns_decay_fraction,
                                                    S = max_steps
    the teacher writes turn k of row r  <=>  u(seed, s, r, k) < p(s)      (`distill.seeds.guided_turn_draw`)

The teacher writes its turn in the same context, continuing the conversation's token ids (a teacher with the student's
tokenizer); its ids are attended by the later turns and not trained (`GuidedTurns.trained` trains them too).

TCOD (Wang et al., 2026, arXiv 2604.24005), its forward-to-backward curriculum: the student's training conversations
stop after D(s) turns, a depth that grows by one every `interval` steps,

    D(s) = min(max_turns, 1 + floor(s / interval))

(the paper's code: `distill_window = 1 + step // checkpoint_steps`, 4 to 6 steps per turn in its runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from distill.seeds import guided_turn_draw


@dataclass(frozen=True)
class GuidedTurns:
    """Guided-OPD's schedule (module docstring): `start` p_0 in [0, 1], decaying linearly to 0 over `decay_steps`
    optimizer steps (> 0); `trained`: the teacher's turns are trained too (else attended only)."""

    start: float
    decay_steps: float
    trained: bool = False

    def probability(self, step: int) -> float:
        """p(step), the chance that the teacher writes a turn at optimizer step `step`."""
        return self.start * max(0.0, 1.0 - step / self.decay_steps)

    def teacher_writes(self, seed: int, step: int, rows: list[int], turn: int) -> list[bool]:
        """Per row (its place among the step's rows over all processes): whether the teacher writes turn `turn`."""
        p = self.probability(step)
        return [p > 0.0 and guided_turn_draw(seed, step, row, turn) < p for row in rows]


@dataclass(frozen=True)
class DepthCurriculum:
    """TCOD's forward-to-backward curriculum (module docstring): one more turn every `interval` (>= 1) steps."""

    interval: int

    def max_turns(self, step: int, max_turns: int) -> int:
        """D(step): the turns a training conversation may have at optimizer step `step`, at most `max_turns`."""
        return min(max_turns, 1 + step // self.interval)
