"""Config fields of rollout reuse and its importance-ratio clips (methods iw_opd, sdft and sdpo)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from distill.config.io import PartFields, setting

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
