"""gold: cross-tokenizer distillation (GOLD / ULD, Boizard et al., 2024): a teacher model with another
tokenizer; completions are aligned by the bytes they spell and compared with ULD (sorted probabilities) or
hybrid ULD (tokens both vocabularies share compared exactly by the generalized JSD), with gkd's on/off-policy
mixing. The teacher scores into aligned signals (`distill.teachers.cross_tokenizer`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from distill.methods import mixing
from distill.methods.async_fields import AsyncFields
from distill.methods.base import Method, Paper
from distill.methods.mixing_fields import MixingFields
from distill.objectives import DivergenceObjective
from distill.registry import Reads
from distill.settings.gold import GoldFields
from distill.signals import ALIGNED

if TYPE_CHECKING:
    from distill.config import DistillConfig

ULD_PAPER = Paper(
    "Towards Cross-Tokenizer Distillation: the Universal Logit Distillation Loss for LLMs (ULD)", "Boizard et al., 2024",
    "2402.12030", "boizard2024uld", "Boizard, Nicolas and El Haddad, Kevin and Hudelot, C{\\'e}line and Colombo, Pierre",
    "booktitle={arXiv preprint}, year={2024}")


def aligned_objective(config: DistillConfig) -> DivergenceObjective:
    """ULD / hybrid ULD on aligned signals only: a teacher model with its own tokenizer."""
    return DivergenceObjective(mixing.beta_for(config), config.temperature, config.loss_chunk_size, frozenset({ALIGNED}))


def hybrid(config: DistillConfig) -> bool:
    return GoldFields.of(config).uld_use_hybrid_loss


class GOLD(Method):
    name = "gold"
    fields = (MixingFields, GoldFields)
    summary = ("a teacher with another tokenizer: byte-aligned completions, ULD or hybrid ULD, gkd's mixing "
               "(the reference's GOLDTrainer)")
    paper = ULD_PAPER
    cross_tokenizer = True
    reads = (Reads("method gold", ("temperature", "uld_use_hybrid_loss", "uld_crossentropy_weight")), *mixing.READS,
             Reads("uld_use_hybrid_loss: true (plain ULD has no beta)", ("beta", "uld_hybrid_matched_weight",
                                                                          "uld_hybrid_unmatched_weight"), hybrid),
             Reads("uld_use_hybrid_loss: true and off-policy micro-batches",
                   mixing.OFF_POLICY_BETA.names, lambda c: hybrid(c) and mixing.off_policy(c)),
             Reads("max_staleness > 0 (the student's samples drawn by older weights)", ("staleness_correction",),
                   lambda c: c.max_staleness > 0))
    defaults = {"beta": 0.5}

    def sources(self, config: DistillConfig) -> mixing.MixedSources:
        return mixing.MixedSources.from_config(config)

    def objective(self, config: DistillConfig):
        return aligned_objective(config)

    def validate(self, config: DistillConfig) -> None:
        mixing.validate(config)
        ahead = AsyncFields.of(config)
        if ahead.max_staleness > 0 and ahead.staleness_correction != "none":
            raise ValueError(f"staleness_correction {ahead.staleness_correction}: gold's ULD on byte-aligned groups takes "
                             "no per-token importance weights; set staleness_correction: none (stale samples trained as "
                             "fresh ones) or max_staleness: 0")
        own = GoldFields.of(config)
        if (own.uld_hybrid_matched_weight is None) != (own.uld_hybrid_unmatched_weight is None):
            raise ValueError("uld_hybrid_matched_weight and uld_hybrid_unmatched_weight: set both (fixed weights) or "
                             "neither (adaptive weights)")
        for name in ("uld_hybrid_matched_weight", "uld_hybrid_unmatched_weight", "uld_crossentropy_weight"):
            value = getattr(config, name)
            if value is not None and (not value >= 0 or math.isinf(value)):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def describe_loss(self, record: dict) -> str:
        kind = "hybrid ULD (matched tokens: generalized JSD)" if record.get("uld_use_hybrid_loss") else "ULD"
        return f"{kind} on byte-aligned token groups across tokenizers; {mixing.describe_mixing(record)}"
