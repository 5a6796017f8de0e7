"""sdft: self-distillation fine-tuning (Shenfeld et al., 2026, arXiv 2601.19897).

The teacher is the student itself, shown privileged context the student does not see (a demonstration, a
fact, a hint: the dataset's `privileged_context` column, through `teacher_prompt_template`). The student
samples a completion from the bare prompt; the self-teacher (`teacher_model_kind`: base, live or ema;
`distill.teachers.self_teacher`) scores the same tokens after its teacher prompt; the student is pulled
toward the teacher's next-token distributions on its own samples (`distill.objectives.self_distillation`:
full-vocabulary generalized JSD, forward KL by default as in the paper; top-k + tail; or sampled-token
reverse KL). Learning from demonstrations on-policy is the paper's answer to SFT's forgetting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.methods.base import Method, Paper
from distill.methods.mixing import ALWAYS_ON_POLICY, MixedSources
from distill.methods.reuse_fields import RolloutReuseFields, check_reuse, stale_samples
from distill.methods.sampling_rules import check_sampling_matches_loss, reused_rollouts
from distill.methods.sdft_fields import SdftFields
from distill.methods.self_teacher_fields import SelfTeacherFields
from distill.methods.self_teacher_prompts import check_chat_prompts, check_template
from distill.methods.self_teacher_rules import (
    check_distillation,
    check_self_teacher,
    sampled_token_loss,
)
from distill.objectives.self_distillation import (
    METRICS,
    SelfDistillationObjective,
    SelfDistillationSettings,
)
from distill.registry import Reads
from distill.teachers.self_teacher import EMAUpdate, SelfTeacher

if TYPE_CHECKING:
    from distill.config import DistillConfig

SDFT_PAPER = Paper(
    "Self-Distillation Enables Continual Learning", "Shenfeld et al., 2026", "2601.19897", "shenfeld2026selfdistillation",
    "Idan Shenfeld and Mehul Damani and Jonas H{\\\"u}botter and Pulkit Agrawal",
    "journal={arXiv preprint arXiv:2601.19897}, year={2026}")

TEACHER_SAMPLES = MixedSources(0.0, seq_kd=True)


class SDFT(Method):
    name = "sdft"
    fields = (RolloutReuseFields, SelfTeacherFields, SdftFields)
    summary = ("self-distillation: the student, shown privileged context, teaches itself on its own samples "
               "(SDFT, arXiv 2601.19897)")
    paper = SDFT_PAPER
    template_fields = ("teacher_prompt_template",)
    teacher = "self"
    defaults = {"beta": 0.0, "distillation_mode": "full_logits"}
    reads = (
        Reads("method sdft", ("beta", "temperature", "teacher_model_kind", "teacher_prompt_template",
                              "max_teacher_prompt_length", "missing_privileged_context", "distillation_mode",
                              "num_iterations", "num_loss_tokens_to_skip", "generate_from_teacher")),
        Reads("teacher_model_kind: ema", ("teacher_update_rate", "teacher_sync_steps"),
              lambda c: SelfTeacherFields.of(c).teacher_model_kind == "ema"),
        Reads("distillation_mode: topk_logits", ("distillation_topk",),
              lambda c: SelfTeacherFields.of(c).distillation_mode == "topk_logits"),
        Reads("num_iterations > 1 or max_staleness > 0 on the student's samples (fresh rollouts have ratio 1)",
              ("distillation_is_clip",), lambda c: stale_samples(c) and not SdftFields.of(c).generate_from_teacher),
        Reads("generate_from_teacher: true", ("teacher_sampling_temperature", "teacher_top_p", "teacher_top_k"),
              lambda c: SdftFields.of(c).generate_from_teacher),
        Reads("generate_from_teacher with teacher_model_kind base (a frozen teacher samples ahead)",
              ("seq_kd_generation_steps",),
              lambda c: (SdftFields.of(c).generate_from_teacher
                         and SelfTeacherFields.of(c).teacher_model_kind == "base")),
    )
    metrics = METRICS

    def sources(self, config: DistillConfig):
        """The student samples every completion; with generate_from_teacher the self-teacher does."""
        return TEACHER_SAMPLES if SdftFields.of(config).generate_from_teacher else ALWAYS_ON_POLICY

    def objective(self, config: DistillConfig) -> SelfDistillationObjective:
        self_teacher = SelfTeacherFields.of(config)
        reused = stale_samples(config) and not SdftFields.of(config).generate_from_teacher
        assert self_teacher.distillation_mode is not None and config.beta is not None  # validate() filled the method's defaults
        return SelfDistillationObjective(SelfDistillationSettings(
            self_teacher.distillation_mode, config.beta, config.temperature, config.loss_chunk_size,
            self_teacher.distillation_topk, self_teacher.distillation_is_clip, reused))

    def rollout_reuse(self, config: DistillConfig) -> int:
        return RolloutReuseFields.of(config).num_iterations

    def loss_tokens_to_skip(self, config: DistillConfig) -> int:
        return SdftFields.of(config).num_loss_tokens_to_skip

    def validate(self, config: DistillConfig) -> None:
        """sdft's own rules, checked before any model loads; every message names the field and the fix."""
        check_reuse(config)
        check_self_teacher(config)
        self_teacher, sdft = SelfTeacherFields.of(config), SdftFields.of(config)
        check_template(self_teacher.teacher_prompt_template, "teacher_prompt_template")
        if self_teacher.max_teacher_prompt_length < 1:
            raise ValueError(f"max_teacher_prompt_length must be a positive integer, "
                             f"got {self_teacher.max_teacher_prompt_length!r}")
        if sdft.missing_privileged_context not in ("error", "skip"):
            raise ValueError(f"missing_privileged_context must be 'error' or 'skip', "
                             f"got {sdft.missing_privileged_context!r}")
        check_distillation(config)
        if self_teacher.distillation_mode == "sampled_token" and sdft.generate_from_teacher:
            raise ValueError("distillation_mode sampled_token is a policy gradient on the student's own samples; with "
                             "generate_from_teacher the teacher samples them. Use full_logits or topk_logits")
        if sdft.num_loss_tokens_to_skip < 0:
            raise ValueError(f"num_loss_tokens_to_skip must be >= 0, got {sdft.num_loss_tokens_to_skip!r}")
        if not sdft.generate_from_teacher:  # the self-teacher's samples train by a divergence, never a policy gradient
            check_sampling_matches_loss(config, sampled_token_loss(config) + reused_rollouts(config))

    def check_examples(self, config: DistillConfig, examples, field: str) -> None:
        """Every training row has a privileged context, unless missing_privileged_context: skip."""
        check_chat_prompts([e for e in examples if e.privileged_context is not None], field)
        missing = [e.index for e in examples if e.privileged_context is None]
        if len(missing) == len(examples):
            raise ValueError(f"{field}: no row has a 'privileged_context' (text the self-teacher sees and the student does "
                             "not); sdft has nothing to learn from. Add the column")
        if not missing or SdftFields.of(config).missing_privileged_context == "skip":
            return
        raise ValueError(f"{field} row {missing[0]} has no 'privileged_context' ({len(missing)} of {len(examples)} rows lack "
                         "one): give every row the text the self-teacher sees, or set missing_privileged_context: skip to "
                         "train them without it (no loss; counted in self_teacher/rows_without_context)")

    def records_log_probs(self, config: DistillConfig) -> bool:
        return stale_samples(config) and not SdftFields.of(config).generate_from_teacher

    def trains_row(self, config: DistillConfig, example) -> bool:
        return example.privileged_context is not None

    def hooks(self, config: DistillConfig, student, teacher: SelfTeacher) -> list:
        self_teacher = SelfTeacherFields.of(config)
        if self_teacher.teacher_model_kind != "ema":
            return []
        assert teacher.copy is not None  # an EMA self-teacher holds its copy
        return [EMAUpdate(teacher.copy, student, self_teacher.teacher_update_rate, self_teacher.teacher_sync_steps)]

    def describe_loss(self, record: dict) -> str:
        mode = {"full_logits": f"generalized JSD over the vocabulary (beta {record['beta']})",
                "topk_logits": f"generalized JSD on the student's top-{record['distillation_topk']} + tail (beta {record['beta']})",
                "sampled_token": "sampled-token reverse KL (REINFORCE)"}[record["distillation_mode"]]
        teacher = record["teacher_model_kind"]
        if teacher == "ema":
            teacher += f" (rate {record['teacher_update_rate']} every {record['teacher_sync_steps']} step(s))"
        samples = "the self-teacher's samples" if record["generate_from_teacher"] else "the student's own samples"
        return f"self-distillation, {mode} on {samples}; self-teacher {teacher} shown the row's privileged context"
