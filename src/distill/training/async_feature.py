"""The asynchronous rollouts feature (`AsyncFields`: rollouts sampled ahead of the weights they train, by
`distill.training.async_rollout`): what it reads and its rules (moved here from the config's checks: a config is checked
against every registered feature)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from distill.config.values import one_of
from distill.features import Feature
from distill.methods.async_fields import AsyncFields
from distill.methods.reuse_fields import RolloutReuseFields
from distill.objectives.staleness import CORRECTIONS, RATIO_LEVELS
from distill.registry import Reads
from distill.training.plan import PACINGS

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.methods.base import Method


class AsyncRollouts(Feature):
    """`max_staleness` is read with on-policy micro-batches, the pacing when it is > 0 (the correction's fields are
    read by the methods whose divergences it corrects, `distill.methods.reuse_fields.STALENESS_CORRECTION`)."""

    name = "async_rollouts"
    fields = (AsyncFields,)

    def reads(self, sources: frozenset[str]) -> tuple[Reads, ...]:
        return (Reads("on-policy micro-batches (the student samples; lmbda > 0)", ("max_staleness",),
                      lambda c: "student" in sources),
                Reads("max_staleness > 0 (asynchronous rollouts)", ("staleness_pacing",),
                      lambda c: AsyncFields.of(c).max_staleness > 0))

    def check_run(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        """Its fields' ranges (max_staleness below max_steps: at max_steps - 1 every rollout already samples the
        starting weights, and an absurd value would have the producer loop over steps that never come); then, sampling
        ahead, that the run samples from the student, reuses no rollout and does not shard the student."""
        own = AsyncFields.of(config)
        if not isinstance(own.max_staleness, int) or own.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0 (0: the synchronous loop), got {own.max_staleness!r}")
        one_of("staleness_pacing", own.staleness_pacing, PACINGS)
        one_of("staleness_correction", own.staleness_correction, CORRECTIONS)
        one_of("staleness_ratio", own.staleness_ratio, RATIO_LEVELS)
        if not (own.staleness_ratio_cap > 1 and math.isfinite(own.staleness_ratio_cap)):
            raise ValueError(f"staleness_ratio_cap must be a finite number > 1 (2 is usual), got {own.staleness_ratio_cap!r}")
        if own.max_staleness == 0:
            return
        if own.max_staleness >= config.max_steps:
            raise ValueError(f"max_staleness {own.max_staleness} is not below max_steps {config.max_steps}: step k's rollout "
                             "is sampled by the weights of step k - max_staleness, so at max_steps - 1 every rollout already "
                             "comes from the weights the run starts with and a larger value changes nothing; set "
                             "max_staleness below max_steps (1 or 2 is usual), or 0 for the synchronous loop")
        if "student" not in sources:
            raise ValueError(f"max_staleness {own.max_staleness}: this run never samples from the student (method "
                             f"{config.method}'s completions come from {sorted(sources)}), so nothing can be sampled "
                             "ahead; set max_staleness: 0")
        if RolloutReuseFields.of(config).num_iterations > 1:
            raise ValueError("max_staleness > 0 with num_iterations > 1: a rollout is either reused or sampled ahead, not "
                             "both; set num_iterations: 1 or max_staleness: 0")
        if config.fsdp:
            raise ValueError("max_staleness > 0 with fsdp: true is not supported (the sampler keeps a whole copy of the "
                             "student beside the sharded one); set max_staleness: 0 or fsdp: false")
