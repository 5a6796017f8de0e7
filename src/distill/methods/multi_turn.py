"""Multi-turn on-policy distillation, shared by the methods that read its fields (on_policy, gkd): Guided-OPD's
teacher-written turns, TCOD's depth curriculum, SOD's step-wise weights (`MultiTurnFields`; the rules:
`distill.agents.guidance`, `distill.losses.step_weights`). All three act on the student's conversations, so each is
read only with tools or an environment (the tool-call loop) and micro-batches the student samples.

Behaviour log-probs. A teacher-written turn is not the student's sample: its tokens carry no student sampling log-prob
(0.0, as the environment's ids), which is right while they are not trained (a ratio over the trained tokens never
reads them) and would be wrong for `guided_turns_trained` under an importance ratio (`max_staleness` with a
staleness correction), which is refused. SOD takes the student's log-probs from its current weights, never the recorded
ones, so a trained teacher turn's gap is the student's and the teacher's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from distill.conversations.fields import ConversationFields
from distill.methods.async_fields import AsyncFields
from distill.methods.multi_turn_fields import MultiTurnFields
from distill.registry import Reads

if TYPE_CHECKING:
    from distill.agents.guidance import DepthCurriculum, GuidedTurns
    from distill.config import DistillConfig
    from distill.objectives.step_weighting import StepDivergenceWeighting


def _talks(config: DistillConfig) -> bool:
    own = ConversationFields.of(config)
    return bool(own.tools) or own.environment is not None


def multi_turn_reads(samples: Callable[[DistillConfig], bool]) -> tuple[Reads, ...]:
    """What a method reads of `MultiTurnFields`; `samples(config)`: the method's plan has student micro-batches."""
    loop = lambda c: _talks(c) and samples(c)  # noqa: E731
    return (
        Reads("tools or an environment (the tool-call loop) and micro-batches the student samples",
              ("guided_turns_probability", "depth_curriculum_interval", "step_divergence_weighting"), loop),
        Reads("guided_turns_probability > 0 (Guided-OPD)", ("guided_turns_decay_fraction", "guided_turns_trained",
                                                           "teacher_sampling_temperature", "teacher_top_p", "teacher_top_k"),
              lambda c: loop(c) and MultiTurnFields.of(c).guided_turns_probability > 0),
        Reads("step_divergence_weighting: true (SOD)", ("step_divergence_delta", "step_divergence_epsilon"),
              lambda c: loop(c) and MultiTurnFields.of(c).step_divergence_weighting),
    )


def validate(config: DistillConfig) -> None:
    """The fields' ranges, and what a guided turn cannot be trained with."""
    own = MultiTurnFields.of(config)
    if not 0.0 <= own.guided_turns_probability <= 1.0:
        raise ValueError(f"guided_turns_probability must be in [0, 1], got {own.guided_turns_probability!r}")
    if not 0.0 < own.guided_turns_decay_fraction <= 1.0:
        raise ValueError(f"guided_turns_decay_fraction must be in (0, 1], got {own.guided_turns_decay_fraction!r}")
    if own.depth_curriculum_interval < 0:
        raise ValueError(f"depth_curriculum_interval must be >= 0 (0: off), got {own.depth_curriculum_interval!r}")
    if not own.step_divergence_delta >= 0.0:
        raise ValueError(f"step_divergence_delta must be >= 0, got {own.step_divergence_delta!r}")
    if not own.step_divergence_epsilon > 0.0:
        raise ValueError(f"step_divergence_epsilon must be > 0, got {own.step_divergence_epsilon!r}")
    ahead = AsyncFields.of(config)
    if own.guided_turns_probability > 0 and own.guided_turns_trained and ahead.max_staleness > 0 \
            and ahead.staleness_correction != "none":
        raise ValueError("guided_turns_trained: true with max_staleness > 0: the importance ratio pi_theta / pi_behaviour "
                         "of a stale sample is over the student's sampled tokens, and a teacher-written turn was not drawn "
                         "by the student (no behaviour log-prob of its own); set guided_turns_trained: false (the teacher's "
                         "turns as context), or staleness_correction: none")


def guided_turns(config: DistillConfig) -> GuidedTurns | None:
    """Guided-OPD's schedule of this run, or None (off)."""
    from distill.agents.guidance import GuidedTurns

    own = MultiTurnFields.of(config)
    if own.guided_turns_probability <= 0 or not _talks(config):
        return None
    return GuidedTurns(own.guided_turns_probability, own.guided_turns_decay_fraction * config.max_steps,
                       own.guided_turns_trained)


def depth_curriculum(config: DistillConfig) -> DepthCurriculum | None:
    """TCOD's depth curriculum of this run, or None (off)."""
    from distill.agents.guidance import DepthCurriculum

    own = MultiTurnFields.of(config)
    return DepthCurriculum(own.depth_curriculum_interval) if own.depth_curriculum_interval > 0 and _talks(config) else None


def step_weighting(config: DistillConfig) -> StepDivergenceWeighting | None:
    """SOD's step-wise weights of this run's divergence, or None (off)."""
    from distill.objectives.step_weighting import StepDivergenceWeighting

    own = MultiTurnFields.of(config)
    if not own.step_divergence_weighting or not _talks(config):
        return None
    return StepDivergenceWeighting(own.step_divergence_epsilon, own.step_divergence_delta)


def guides_turns(config: DistillConfig) -> bool:
    """Whether a teacher writes turns of the student's conversations in this run (Guided-OPD)."""
    return guided_turns(config) is not None


def describe(record: dict) -> str:
    """The multi-turn options a run used, for the model card ("" when none; `record`: the run's config.yaml)."""
    used = []
    if record.get("guided_turns_probability"):
        trained = ", trained" if record.get("guided_turns_trained") else ""
        used.append(f"teacher-guided turns (Guided-OPD, arXiv 2606.15912: p0 {record['guided_turns_probability']} decaying "
                    f"to 0 over {record.get('guided_turns_decay_fraction', 1.0)} of the run{trained})")
    if record.get("depth_curriculum_interval"):
        used.append(f"a depth curriculum (TCOD, arXiv 2604.24005: one more turn every {record['depth_curriculum_interval']} "
                    "steps)")
    if record.get("step_divergence_weighting"):
        used.append(f"step-wise weights (SOD, arXiv 2605.07725: delta {record.get('step_divergence_delta', 0.2)})")
    return "; " + ", ".join(used) if used else ""
