"""gkd: generalized knowledge distillation (Agarwal et al., 2024): the generalized JSD between the student's
and the teacher's next-token distributions, on a mix of student samples (on-policy, probability lmbda) and
dataset or teacher completions (off-policy; `seq_kd` for the teacher's). Any same-tokenizer teacher: a model
(dense signal), a server or a cache (sparse top-k + tail)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.methods import mixing, multi_turn
from distill.methods.base import Method, Paper
from distill.methods.mixing_fields import MixingFields
from distill.methods.multi_turn_fields import MultiTurnFields
from distill.methods.reuse_fields import STALENESS_CORRECTION, staleness_correction
from distill.methods.sampling_rules import check_staleness_correction
from distill.objectives import DivergenceObjective
from distill.objectives.step_weighting import STEP_WEIGHT_METRICS
from distill.registry import Reads
from distill.signals import DENSE, SPARSE

if TYPE_CHECKING:
    from distill.agents.guidance import DepthCurriculum, GuidedTurns
    from distill.config import DistillConfig

GKD_PAPER = Paper(
    "On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes (GKD)", "Agarwal et al., 2024",
    "2306.13649", "agarwal2024onpolicy",
    "Agarwal, Rishabh and Vieillard, Nino and Zhou, Yongchao and Stanczyk, Piotr and Ramos, Sabela and Geist, Matthieu "
    "and Bachem, Olivier", "booktitle={ICLR}, year={2024}")


def divergence_objective(config: DistillConfig) -> DivergenceObjective:
    """Same-tokenizer teachers: a model (dense), a server or a cache (sparse); SOD's step weights with
    `step_divergence_weighting`."""
    return DivergenceObjective(mixing.beta_for(config), config.temperature, config.loss_chunk_size, frozenset({DENSE, SPARSE}),
                               staleness_correction(config), multi_turn.step_weighting(config))


def describe_jsd(record: dict) -> str:
    off = record["off_policy_beta"] if record.get("off_policy_beta") is not None else record["beta"]
    return f"generalized JSD, beta {record['beta']} on student samples, off-policy beta {off}"


class GKD(Method):
    name = "gkd"
    fields = (MixingFields, MultiTurnFields)
    summary = "generalized JSD with on/off-policy mixing (lmbda, seq_kd; GKD, arXiv 2306.13649)"
    paper = GKD_PAPER
    reads = (Reads("method gkd", ("beta", "temperature")), *mixing.READS, mixing.OFF_POLICY_BETA, STALENESS_CORRECTION,
             *multi_turn.multi_turn_reads(lambda config: "student" in mixing.MixedSources.from_config(config).possible()))
    defaults = {"beta": 0.5}
    metrics = STEP_WEIGHT_METRICS

    def sources(self, config: DistillConfig) -> mixing.MixedSources:
        return mixing.MixedSources.from_config(config)

    def objective(self, config: DistillConfig) -> DivergenceObjective:
        return divergence_objective(config)

    def validate(self, config: DistillConfig) -> None:
        mixing.validate(config)
        check_staleness_correction(config, self.name)
        multi_turn.validate(config)

    def guided_turns(self, config: DistillConfig) -> GuidedTurns | None:
        return multi_turn.guided_turns(config)

    def depth_curriculum(self, config: DistillConfig) -> DepthCurriculum | None:
        return multi_turn.depth_curriculum(config)

    def records_log_probs(self, config: DistillConfig) -> bool:
        return staleness_correction(config) is not None  # pi_behaviour of every sampled token, for the ratio

    def describe_loss(self, record: dict) -> str:
        return f"{describe_jsd(record)}; {mixing.describe_mixing(record)}{multi_turn.describe(record)}"
