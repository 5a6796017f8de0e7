"""on_policy: the student samples every completion and the generalized JSD pulls its next-token
distributions toward the teacher's (GKD with lmbda fixed to 1; the reference library's DistillationTrainer)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.methods import multi_turn
from distill.methods.base import Method
from distill.methods.gkd import GKD_PAPER, describe_jsd, divergence_objective
from distill.methods.mixing import ALWAYS_ON_POLICY
from distill.methods.multi_turn_fields import MultiTurnFields
from distill.methods.reuse_fields import STALENESS_CORRECTION, staleness_correction
from distill.methods.sampling_rules import check_staleness_correction
from distill.objectives import DivergenceObjective
from distill.objectives.step_weighting import STEP_WEIGHT_METRICS
from distill.registry import Reads

if TYPE_CHECKING:
    from distill.agents.guidance import DepthCurriculum, GuidedTurns
    from distill.config import DistillConfig


class OnPolicy(Method):
    name = "on_policy"
    fields = (MultiTurnFields,)
    summary = "the student samples every completion (lmbda fixed to 1; the reference's DistillationTrainer)"
    paper = GKD_PAPER
    reads = (Reads("method on_policy", ("beta", "temperature")), STALENESS_CORRECTION,
             *multi_turn.multi_turn_reads(lambda config: True))
    defaults = {"beta": 0.5}
    metrics = STEP_WEIGHT_METRICS

    def sources(self, config: DistillConfig):
        return ALWAYS_ON_POLICY

    def objective(self, config: DistillConfig) -> DivergenceObjective:
        return divergence_objective(config)

    def validate(self, config: DistillConfig) -> None:
        check_staleness_correction(config, self.name)
        multi_turn.validate(config)

    def guided_turns(self, config: DistillConfig) -> GuidedTurns | None:
        return multi_turn.guided_turns(config)

    def depth_curriculum(self, config: DistillConfig) -> DepthCurriculum | None:
        return multi_turn.depth_curriculum(config)

    def records_log_probs(self, config: DistillConfig) -> bool:
        return staleness_correction(config) is not None  # pi_behaviour of every sampled token, for the ratio

    def describe_loss(self, record: dict) -> str:
        return (f"{describe_jsd(record).split(', off-policy')[0]}; every completion sampled by the student"
                f"{multi_turn.describe(record)}")
