"""iw_opd: importance-weighted on-policy distillation (Xie et al., 2026, arXiv 2606.22600).

A teacher-guided policy gradient on the student's own samples: each sampled token's advantage is the
teacher's log-prob of it minus the sampling policy's, weighted by a prefix decay that favours a sequence's
early tokens, in PPO's clipped surrogate (`distill.objectives.iw_opd`). Rollouts may be reused for
`num_iterations` optimizer steps. An optional warm-up (`teacher_warmup_steps`) first trains on teacher
samples with forward KL, since a fresh student's own samples carry little signal. Teachers: a model with
the student's tokenizer, or a server (the completion token's entry of `prompt_logprobs`); never a cache,
which holds completions written before the run, not the student's samples.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from distill.losses.policy_gradient import ClipSettings
from distill.methods.base import Method, Paper
from distill.methods.iw_opd_fields import IwOpdFields
from distill.methods.mixing import ALWAYS_ON_POLICY, MixedSources
from distill.methods.reuse_fields import RolloutReuseFields, check_reuse, stale_samples
from distill.methods.sampling_rules import check_sampling_matches_loss
from distill.objectives.iw_opd import (
    MAXIMA,
    METRICS,
    MINIMA,
    IWOPDObjective,
    IWOPDSettings,
)
from distill.registry import Reads
from distill.settings.locations import CacheFields, ServerFields

if TYPE_CHECKING:
    from distill.config import DistillConfig

IW_OPD_PAPER = Paper(
    "On the Position Bias of On-Policy Distillation", "Xie et al., 2026", "2606.22600", "xie2026position",
    "Yan Xie and Sijie Zhu and Tiansheng Wen and Bo Chen and Yifei Wang",
    "journal={arXiv preprint arXiv:2606.22600}, year={2026}")


def clip_settings(config: DistillConfig) -> ClipSettings:
    reuse = RolloutReuseFields.of(config)
    return ClipSettings(reuse.epsilon_low, reuse.epsilon_high, reuse.dual_clip)


class IWOPD(Method):
    name = "iw_opd"
    fields = (IwOpdFields, RolloutReuseFields)
    summary = ("importance-weighted on-policy distillation: sampled-token policy gradient with prefix-decayed "
               "weights (arXiv 2606.22600)")
    paper = IW_OPD_PAPER
    reads = (
        Reads("method iw_opd", ("temperature", "iw_opd_gamma", "iw_opd_epsilon", "num_iterations", "teacher_warmup_steps")),
        Reads("num_iterations > 1 or max_staleness > 0 (with fresh rollouts the ratio is 1)",
              ("epsilon_low", "epsilon_high", "dual_clip"), stale_samples),
        Reads("teacher_warmup_steps > 0 (teacher-sampled warm-up)",
              ("teacher_sampling_temperature", "teacher_top_p", "teacher_top_k", "seq_kd_generation_steps"),
              lambda c: IwOpdFields.of(c).teacher_warmup_steps > 0),
    )
    metrics, maxima, minima = METRICS, MAXIMA, MINIMA

    def sources(self, config: DistillConfig):
        """Teacher samples for the warm-up steps (sequence-level KD), the student's own after."""
        iw = IwOpdFields.of(config)
        if iw.teacher_warmup_steps == 0:
            return ALWAYS_ON_POLICY
        return MixedSources(1.0, "step", 0.0, iw.teacher_warmup_steps, seq_kd=True)

    def objective(self, config: DistillConfig) -> IWOPDObjective:
        iw = IwOpdFields.of(config)
        reused = stale_samples(config)
        return IWOPDObjective(IWOPDSettings(iw.iw_opd_gamma, iw.iw_opd_epsilon, clip_settings(config),
                                            config.temperature, config.loss_chunk_size, reused))

    def rollout_reuse(self, config: DistillConfig) -> int:
        return RolloutReuseFields.of(config).num_iterations

    def validate(self, config: DistillConfig) -> None:
        """iw_opd's own rules; every message names the field and the fix."""
        check_reuse(config)
        iw = IwOpdFields.of(config)
        if not (iw.iw_opd_gamma >= 0 and math.isfinite(iw.iw_opd_gamma)):
            raise ValueError(f"iw_opd_gamma must be a finite number >= 0 (0 = plain sampled-token OPD), "
                             f"got {iw.iw_opd_gamma!r}")
        if not (iw.iw_opd_epsilon > 0 and math.isfinite(iw.iw_opd_epsilon)):
            raise ValueError(f"iw_opd_epsilon must be a finite number > 0 (1e-8 is usual), got {iw.iw_opd_epsilon!r}")
        if iw.teacher_warmup_steps < 0:
            raise ValueError(f"teacher_warmup_steps must be >= 0, got {iw.teacher_warmup_steps!r}")
        try:
            clip_settings(config)
        except ValueError as error:
            raise ValueError(f"epsilon_low / epsilon_high / dual_clip: {error}") from None
        if CacheFields.of(config).teacher_cache is not None:
            raise ValueError("teacher_cache: iw_opd learns from the student's own samples, and a cache holds completions "
                             "written before the run, which it cannot score; use a teacher model or teacher_url")
        check_sampling_matches_loss(config, ["iw_opd (a policy gradient on the student's samples)"])
        if iw.teacher_warmup_steps and ServerFields.of(config).teacher_url is not None:
            raise ValueError("teacher_warmup_steps needs a teacher model that samples; a teacher_url server only scores. "
                             "Set teacher_warmup_steps: 0")

    def records_log_probs(self, config: DistillConfig) -> bool:
        return True  # pi_old of every sampled token

    def describe_loss(self, record: dict) -> str:
        parts = [f"IW-OPD, gamma {record['iw_opd_gamma']}, {record['num_iterations']} optimizer step(s) per rollout"]
        if record["num_iterations"] > 1:
            parts.append(f"ratio clip [{1 - record['epsilon_low']:g}, {1 + record['epsilon_high']:g}], dual clip {record['dual_clip']}")
        if record["teacher_warmup_steps"]:
            parts.append(f"after {record['teacher_warmup_steps']} warm-up steps of forward KL on teacher samples")
        return "; ".join(parts)
