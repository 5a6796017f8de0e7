"""GKD's on/off-policy mixing, shared by the methods that use it (gkd, gold).

Each micro-batch is on-policy (the student samples) with probability lmbda at that optimizer step, else
off-policy: the dataset's completion, or the teacher's sample with `seq_kd`. lmbda follows a schedule.
Student samples get `beta`; off-policy ones `off_policy_beta` (None: `beta`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from distill.methods.mixing_fields import LMBDA_SCHEDULES, MixingFields
from distill.registry import Reads
from distill.seeds import source_draw_seed

if TYPE_CHECKING:
    from distill.config import DistillConfig


def draw_sources(lmbda: float, seq_kd: bool, seed: int, step: int, num_micro_batches: int) -> list[str]:
    """The source of each micro-batch of optimizer step `step`; identical on every process."""
    generator = torch.Generator().manual_seed(source_draw_seed(seed, step))
    draws = torch.rand(num_micro_batches, generator=generator, dtype=torch.float64)
    off_policy = "teacher" if seq_kd else "dataset"
    return ["student" if float(u) < lmbda else off_policy for u in draws]


@dataclass(frozen=True)
class MixedSources:
    """A source plan (`distill.training.plan.SourcePlan`): lmbda per step, seq_kd for the off-policy source."""

    lmbda_end: float
    schedule: str = "constant"
    lmbda_start: float = 0.0
    schedule_steps: int = 0
    seq_kd: bool = False

    @classmethod
    def from_config(cls, config: DistillConfig) -> "MixedSources":
        own = MixingFields.of(config)
        return cls(own.lmbda, own.lmbda_schedule, own.lmbda_start, own.lmbda_schedule_steps, own.seq_kd)

    def logged(self, step: int) -> dict[str, float]:
        return {"lmbda": self.lmbda(step)}

    def lmbda(self, step: int) -> float:
        """lmbda at optimizer step `step` (0-based)."""
        if self.schedule == "constant" or self.schedule_steps <= 0:
            return self.lmbda_end
        if self.schedule == "step":
            return self.lmbda_start if step < self.schedule_steps else self.lmbda_end
        fraction = min(step / self.schedule_steps, 1.0)
        return self.lmbda_start + fraction * (self.lmbda_end - self.lmbda_start)

    def draw(self, seed: int, step: int, num_micro_batches: int) -> list[str]:
        return draw_sources(self.lmbda(step), self.seq_kd, seed, step, num_micro_batches)

    def possible(self) -> frozenset[str]:
        """The sources some micro-batch can draw over the whole schedule."""
        scheduled = self.schedule != "constant" and self.schedule_steps > 0
        values = [self.lmbda_end] + ([self.lmbda_start] if scheduled else [])
        found = set()
        if any(v > 0.0 for v in values):
            found.add("student")
        if any(v < 1.0 for v in values):
            found.add("teacher" if self.seq_kd else "dataset")
        return frozenset(found)


ALWAYS_ON_POLICY = MixedSources(1.0)


def beta_for(config: DistillConfig):
    """The loss beta of each completion source: `beta` for student samples, `off_policy_beta` for the rest."""
    off_policy_beta = MixingFields.of(config).off_policy_beta
    off = config.beta if off_policy_beta is None else off_policy_beta
    return lambda source: config.beta if source == "student" else off


def off_policy(config: DistillConfig) -> bool:
    return bool(MixedSources.from_config(config).possible() - {"student"})


READS = (
    Reads("on/off-policy mixing (methods gkd, gold)", ("lmbda", "lmbda_schedule", "seq_kd")),
    Reads("a non-constant lmbda_schedule", ("lmbda_start", "lmbda_schedule_steps"),
          lambda c: MixingFields.of(c).lmbda_schedule != "constant"),
    Reads("seq_kd: true", ("teacher_sampling_temperature", "teacher_top_p", "teacher_top_k", "seq_kd_generation_steps"),
          lambda c: MixingFields.of(c).seq_kd),
)
OFF_POLICY_BETA = Reads("off-policy micro-batches (lmbda < 1)", ("off_policy_beta",), off_policy)


def validate(config: DistillConfig) -> None:
    """The mixing fields' own ranges."""
    own = MixingFields.of(config)
    if own.lmbda_schedule not in LMBDA_SCHEDULES:
        raise ValueError(f"lmbda_schedule must be one of {LMBDA_SCHEDULES}, got {own.lmbda_schedule!r}")
    for name in ("lmbda", "lmbda_start") + (("off_policy_beta",) if own.off_policy_beta is not None else ()):
        if not 0.0 <= getattr(own, name) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {getattr(own, name)!r}")
    if own.lmbda_schedule_steps < 0:
        raise ValueError(f"lmbda_schedule_steps must be >= 0, got {own.lmbda_schedule_steps!r}")


def describe_mixing(record: dict) -> str:
    """The mixing settings of a run, for the model card."""
    return f"lmbda {record['lmbda']} ({record['lmbda_schedule']}); seq_kd {record['seq_kd']}"
