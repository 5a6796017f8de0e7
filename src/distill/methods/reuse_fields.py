"""Config fields of rollout reuse and its importance-ratio clips (methods iw_opd, sdft and sdpo), and the rules of
samples from older weights that every method shares (reused, or sampled ahead with `max_staleness`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distill.config.io import PartFields, setting
from distill.methods.async_fields import AsyncFields
from distill.registry import Reads

if TYPE_CHECKING:
    from distill.config import DistillConfig


@dataclass
class RolloutReuseFields(PartFields):
    num_iterations: int = setting(1, "Optimizer steps per generation batch. Above 1, a step's "
                                  "rollouts (with their sampling log-probs) are reused for the next num_iterations - 1 "
                                  "steps, and an importance ratio pi_theta / pi_old, clipped, corrects for the moved "
                                  "policy (epsilon_low / epsilon_high / dual_clip for a policy gradient, distillation_is_clip for a self-distillation loss); "
                                  "each rollout takes the sampler's next batch of prompts.")
    epsilon_low: float = setting(0.2, "PPO ratio clip, lower side: rho is clipped at 1 - epsilon_low (read with "
                                 "num_iterations > 1; with fresh rollouts rho = 1).")
    epsilon_high: float = setting(0.2, "PPO ratio clip, upper side: rho is clipped at 1 + epsilon_high.")
    dual_clip: float | None = setting(3.0, "Dual clip for negative advantages: the surrogate is bounded below by "
                                      "dual_clip x A (must be > 1); None = off.")


def check_reuse(config: DistillConfig) -> None:
    """The reuse window's rule, for the methods that read it (their `validate`)."""
    num_iterations = RolloutReuseFields.of(config).num_iterations
    if num_iterations <= 0:
        raise ValueError(f"num_iterations must be a positive integer, got {num_iterations!r}")


def stale_samples(config: DistillConfig) -> bool:
    """Whether the student's samples may be trained on by weights that moved since they were drawn: rollouts
    reused (`num_iterations` > 1) or sampled ahead (`max_staleness` > 0). Then an importance ratio against the
    log-probs recorded at sampling corrects them (each method's own, clipped)."""
    return RolloutReuseFields.of(config).num_iterations > 1 or AsyncFields.of(config).max_staleness > 0


# gkd's, on_policy's and gold's divergences on stale student samples: `distill.objectives.staleness`.
STALENESS_CORRECTION = Reads("max_staleness > 0 (the student's samples drawn by older weights)",
                             ("staleness_correction", "staleness_ratio", "staleness_ratio_cap"),
                             lambda c: AsyncFields.of(c).max_staleness > 0)


def staleness_correction(config: DistillConfig):
    """The divergence objective's correction of stale student samples (`StalenessCorrection`), or None when nothing
    is stale (max_staleness 0) or the run asks for none."""
    from distill.objectives.staleness import StalenessCorrection

    ahead = AsyncFields.of(config)
    if ahead.max_staleness == 0 or ahead.staleness_correction == "none":
        return None
    return StalenessCorrection(ahead.staleness_correction, ahead.staleness_ratio, ahead.staleness_ratio_cap)
