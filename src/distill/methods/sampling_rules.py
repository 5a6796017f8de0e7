"""The rule every estimator on the student's own samples shares, written once.

A sampled-token policy gradient (iw_opd; sdft's and sdpo's `distillation_mode: sampled_token`; sdpo's group
policy loss) is REINFORCE: unbiased only when the tokens were drawn from the distribution the loss
differentiates, softmax(z / temperature) over the whole vocabulary. An importance ratio pi_theta / pi_old
(rollouts reused, `num_iterations > 1`) needs the same: pi_old is that distribution at sampling time. So
the student's sampling must use the loss temperature and no truncation (top_p 1, top_k 0).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.methods.async_fields import AsyncFields
from distill.methods.reuse_fields import RolloutReuseFields, staleness_correction

if TYPE_CHECKING:
    from distill.config import DistillConfig


def check_sampling_matches_loss(config: DistillConfig, estimators: list[str]) -> None:
    """Raise ValueError, naming both fields and the estimators that need it, unless the student samples from
    the loss's distribution; `estimators`: what in this run needs it (empty: nothing does)."""
    if not estimators:
        return
    needs = " and ".join(estimators)
    if config.sampling_temperature != config.temperature:
        raise ValueError(f"sampling_temperature ({config.sampling_temperature}) and temperature ({config.temperature}) must be "
                         f"equal for {needs}: the estimate is of the distribution the samples were drawn from, at the "
                         f"loss temperature; set sampling_temperature: {config.temperature} (or temperature: "
                         f"{config.sampling_temperature})")
    if config.top_p != 1.0 or config.top_k != 0:
        raise ValueError(f"top_p ({config.top_p}) and top_k ({config.top_k}): {needs} needs samples from the student's whole "
                         "distribution, and truncated sampling draws from a renormalised one the loss does not "
                         "differentiate; set top_p: 1 and top_k: 0")


def reused_rollouts(config: DistillConfig, student_samples: bool = True) -> list[str]:
    """The importance ratio's claim, when the student's samples are reused or sampled ahead."""
    claims = []
    if RolloutReuseFields.of(config).num_iterations > 1:
        claims.append("num_iterations > 1 (the importance ratio pi_theta / pi_old)")
    if AsyncFields.of(config).max_staleness > 0:
        claims.append("max_staleness > 0 (the importance ratio pi_theta / pi_behaviour)")
    return claims if student_samples else []


def check_staleness_correction(config: DistillConfig, method: str) -> None:
    """The divergence methods' rule under `max_staleness`: the ratio pi_theta / pi_behaviour is of the distribution
    the student sampled, which must be the loss's."""
    if staleness_correction(config) is not None:
        check_sampling_matches_loss(config, [f"max_staleness > 0 with staleness_correction {AsyncFields.of(config).staleness_correction} "
                                             f"({method}: the importance ratio pi_theta / pi_behaviour)"])
