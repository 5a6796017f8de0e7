"""The sdpo `Method` (the package docstring says what sdpo does): its sources, objective, validation,
checks of the rows, step stage, hooks and model-card lines."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from distill.agents.setup import offering_tools
from distill.conversations.environments import EnvironmentFactory
from distill.conversations.fields import ConversationFields
from distill.conversations.tools import load_tools
from distill.losses.policy_gradient import ClipSettings
from distill.methods.base import Method, Paper
from distill.methods.mixing import ALWAYS_ON_POLICY
from distill.methods.reuse_fields import RolloutReuseFields, check_reuse, stale_samples
from distill.methods.sampling_rules import check_sampling_matches_loss, reused_rollouts
from distill.methods.sdpo.fields import SdpoFields
from distill.methods.sdpo.reprompts import Reprompts, check_reprompt_templates
from distill.methods.sdpo.rewards import (
    ANSWER_REWARDS,
    Rewards,
    load_reward_function,
    weighted_range,
)
from distill.methods.sdpo.stage import ADVANTAGE_SCALINGS, GroupSettings, RewardStage
from distill.methods.self_teacher_fields import SelfTeacherFields
from distill.methods.self_teacher_prompts import check_chat_prompts
from distill.methods.self_teacher_rules import (
    check_distillation,
    check_self_teacher,
    sampled_token_loss,
)
from distill.models.kinds import model_kind_of
from distill.objectives.group_policy import PolicySettings
from distill.objectives.sdpo import METRICS, SDPOObjective, SDPOSettings
from distill.objectives.self_distillation import SelfDistillationSettings
from distill.registry import Reads
from distill.teachers.self_teacher import EMAUpdate, SelfTeacher

if TYPE_CHECKING:
    from distill.config import DistillConfig

SDPO_PAPER = Paper(
    "Reinforcement Learning via Self-Distillation", "Hübotter et al., 2026", "2601.20802", "hubotter2026sdpo",
    "Jonas H{\\\"u}botter and Frederike L{\\\"u}beck and Lejs Behric and Anton Baumann and Marco Bagatella and "
    "Daniel Marta and Ido Hakimi and Idan Shenfeld and Thomas Kleine Buening and Carlos Guestrin and Andreas Krause",
    "journal={arXiv preprint arXiv:2601.20802}, year={2026}")


def distils(config: DistillConfig) -> bool:
    return SdpoFields.of(config).distillation_weight > 0


def reward_weights(config: DistillConfig) -> list[float]:
    sdpo = SdpoFields.of(config)
    weights = sdpo.reward_weights if sdpo.reward_weights is not None else [1.0] * len(sdpo.reward_funcs)
    try:
        return [float(w) for w in weights]
    except (TypeError, ValueError):
        raise ValueError(f"reward_weights must be numbers, got {sdpo.reward_weights!r}") from None


def rewards(config: DistillConfig) -> Rewards:
    """The configured reward functions (each resolved now: an unknown name or import path is an error)."""
    sdpo = SdpoFields.of(config)
    environment = environment_owns_reward(config)
    if not sdpo.reward_funcs and not environment:
        raise ValueError("reward_funcs is empty: name at least one reward function (e.g. contains_answer), or an "
                         "environment with a get_reward method")
    functions = [load_reward_function(str(spec), sdpo.reward_regex) for spec in sdpo.reward_funcs]
    weights = reward_weights(config)
    if len(weights) != len(functions):
        raise ValueError(f"reward_weights has {len(weights)} values for {len(functions)} reward_funcs; give one per function")
    if any(not math.isfinite(w) for w in weights):
        raise ValueError(f"reward_weights must be finite numbers, got {weights}")
    return Rewards(functions, weights, environment)


def environment_owns_reward(config: DistillConfig) -> bool:
    """The run's environment defines get_reward (its reward joins reward_funcs')."""
    talk = ConversationFields.of(config)
    if talk.environment is None:
        return False
    return EnvironmentFactory.load(talk.environment, set(load_tools(list(talk.tools)))).owns_reward


class SDPO(Method):
    name = "sdpo"
    fields = (RolloutReuseFields, SelfTeacherFields, SdpoFields)
    summary = ("RL with rewards where failed rollouts learn from the model re-prompted with a successful sibling "
               "(SDPO, arXiv 2601.20802); distillation_weight 0 is GRPO")
    paper = SDPO_PAPER
    teacher = "self"
    template_fields = ("reprompt_template", "solution_template", "feedback_template")  # grpo: a control, never shown
    defaults = {"beta": 1.0, "distillation_mode": "sampled_token"}
    reads = (
        Reads("method sdpo", ("num_generations", "reward_funcs", "reward_weights", "distillation_weight",
                              "success_reward_threshold", "num_iterations", "temperature")),
        Reads("reward_funcs with 'regex'", ("reward_regex",),
              lambda c: "regex" in [str(f) for f in SdpoFields.of(c).reward_funcs]),
        Reads("distillation_weight < 1 (a policy loss)", ("loss_type", "advantage_scaling"),
              lambda c: SdpoFields.of(c).distillation_weight < 1),
        Reads("distillation_weight < 1 with num_iterations > 1 or max_staleness > 0 (the PPO ratio clip)",
              ("epsilon_low", "epsilon_high"), lambda c: SdpoFields.of(c).distillation_weight < 1 and stale_samples(c)),
        Reads("distillation_weight > 0 (a self-teacher)", ("teacher_model_kind", "beta", "distillation_mode",
                                                           "demonstration_from_self", "include_feedback", "reprompt_template",
                                                           "solution_template", "remove_thinking_from_demonstration",
                                                           "max_reprompt_length"), distils),
        Reads("distillation_weight > 0 with include_feedback", ("feedback_template", "feedback_only_without_solution"),
              lambda c: distils(c) and SdpoFields.of(c).include_feedback),
        Reads("distillation_weight > 0 with teacher_model_kind: ema", ("teacher_update_rate", "teacher_sync_steps"),
              lambda c: distils(c) and SelfTeacherFields.of(c).teacher_model_kind == "ema"),
        Reads("distillation_weight > 0 with distillation_mode: topk_logits", ("distillation_topk",),
              lambda c: distils(c) and SelfTeacherFields.of(c).distillation_mode == "topk_logits"),
        Reads("distillation_weight > 0 with num_iterations > 1 or max_staleness > 0", ("distillation_is_clip",),
              lambda c: distils(c) and stale_samples(c)),
        # As for sdft and sft: the evaluation compares with the initial model, shown a row's privileged context if any.
        Reads("eval_before_after: true (the evaluation's teacher is the initial model shown the row's context)",
              ("teacher_prompt_template", "max_teacher_prompt_length"), lambda c: c.eval_before_after),
    )
    metrics = METRICS
    teacher_prompt_budget = "max_reprompt_length"

    def sources(self, config: DistillConfig):
        return ALWAYS_ON_POLICY

    def objective(self, config: DistillConfig) -> SDPOObjective:
        reuse, self_teacher, sdpo = RolloutReuseFields.of(config), SelfTeacherFields.of(config), SdpoFields.of(config)
        reused = stale_samples(config)
        policy = PolicySettings(sdpo.loss_type, ClipSettings(reuse.epsilon_low, reuse.epsilon_high, dual_clip=None),
                                config.temperature, config.loss_chunk_size, config.max_new_tokens, reused)
        assert self_teacher.distillation_mode is not None and config.beta is not None  # validate() filled the method's defaults
        distillation = SelfDistillationSettings(self_teacher.distillation_mode, config.beta, config.temperature,
                                                config.loss_chunk_size, self_teacher.distillation_topk,
                                                self_teacher.distillation_is_clip, reused)
        return SDPOObjective(SDPOSettings(sdpo.distillation_weight, policy, distillation))

    def rollout_reuse(self, config: DistillConfig) -> int:
        return RolloutReuseFields.of(config).num_iterations

    def validate(self, config: DistillConfig) -> None:
        """sdpo's own rules, checked before any model loads; every message names the field and the fix."""
        check_reuse(config)
        sdpo = SdpoFields.of(config)
        if sdpo.num_generations < 2:
            raise ValueError(f"num_generations must be >= 2 (a group's advantages compare its completions), got "
                             f"{sdpo.num_generations!r}")
        if sdpo.advantage_scaling not in ADVANTAGE_SCALINGS:
            raise ValueError(f"advantage_scaling must be one of {ADVANTAGE_SCALINGS}, got {sdpo.advantage_scaling!r}")
        self.objective(config)  # its settings check loss_type, distillation_weight and the self-distillation loss's fields
        configured = rewards(config)
        span = None if configured.environment else weighted_range(configured.functions, configured.weights)
        threshold = sdpo.success_reward_threshold
        if not math.isfinite(threshold):
            raise ValueError(f"success_reward_threshold must be a finite number, got {threshold!r}")
        if span is not None and not span[0] < threshold <= span[1]:
            raise ValueError(f"success_reward_threshold {threshold} is outside the reward range ({span[0]:g}, {span[1]:g}] "
                             f"of reward_funcs {list(configured.names)} with weights {configured.weights}: "
                             + ("no rollout could succeed" if threshold > span[1] else "every rollout would succeed")
                             + "; set it within the range")
        if distils(config):
            check_self_teacher(config)
            check_distillation(config)
            check_reprompt_templates(sdpo.reprompt_template, sdpo.solution_template, sdpo.feedback_template)
            if sdpo.max_reprompt_length < 1:
                raise ValueError(f"max_reprompt_length must be a positive integer, got {sdpo.max_reprompt_length!r}")
        policy = ["the policy loss (distillation_weight < 1)"] if sdpo.distillation_weight < 1.0 else []
        check_sampling_matches_loss(config, policy + (sampled_token_loss(config) if distils(config) else []) + reused_rollouts(config))

    def check_examples(self, config: DistillConfig, examples, field: str) -> None:
        """Answer rewards need an `answer` on every row; feedback needs a row that has some."""
        sdpo = SdpoFields.of(config)
        names = [str(spec) for spec in sdpo.reward_funcs]
        needing = [name for name in names if name in ANSWER_REWARDS]
        missing = [e.index for e in examples if e.answer is None]
        if needing and missing:
            raise ValueError(f"{field} row {missing[0]} has no 'answer' ({len(missing)} of {len(examples)} rows lack one), "
                             f"which reward function {needing[0]} checks completions against; add the column or choose "
                             "other reward_funcs")
        if distils(config):
            check_chat_prompts(examples, field)
        if distils(config) and sdpo.include_feedback and not any(e.feedback or e.privileged_context for e in examples):
            raise ValueError(f"include_feedback: no {field} row has a 'feedback' (or 'privileged_context') column to show "
                             "the self-teacher; add one or set include_feedback: false")

    def records_log_probs(self, config: DistillConfig) -> bool:
        return stale_samples(config)

    def group_size(self, config: DistillConfig) -> int:
        return SdpoFields.of(config).num_generations

    def stage(self, config: DistillConfig, parts) -> RewardStage:
        sdpo = SdpoFields.of(config)
        settings = GroupSettings(sdpo.num_generations, sdpo.advantage_scaling, sdpo.success_reward_threshold,
                                 sdpo.demonstration_from_self, sdpo.include_feedback,
                                 sdpo.feedback_only_without_solution, sdpo.remove_thinking_from_demonstration)
        reprompts = None
        if distils(config):
            encoder = offering_tools(config, model_kind_of(parts.student).encoder(
                parts.tokenizer, sdpo.max_reprompt_length, config.max_new_tokens, parts.eos_ids, parts.student,
                config.teacher_template_kwargs()))
            reprompts = Reprompts(encoder, sdpo.reprompt_template, sdpo.solution_template, sdpo.feedback_template)
        return RewardStage(rewards(config), settings, reprompts, parts.tokenizer, parts.runtime, parts.first_row)

    def hooks(self, config: DistillConfig, student, teacher: SelfTeacher) -> list:
        self_teacher = SelfTeacherFields.of(config)
        if not distils(config) or self_teacher.teacher_model_kind != "ema":
            return []
        assert teacher.copy is not None  # an EMA self-teacher holds its copy
        return [EMAUpdate(teacher.copy, student, self_teacher.teacher_update_rate, self_teacher.teacher_sync_steps)]

    def describe_loss(self, record: dict) -> str:
        w = record["distillation_weight"]
        policy = f"group policy gradient ({record['loss_type']}, {record['num_generations']} completions per prompt)"
        if w == 0:
            return f"GRPO: {policy} on rewards ({', '.join(map(str, record['reward_funcs']))})"
        teacher = record["teacher_model_kind"]
        distillation = (f"self-distillation ({record['distillation_mode']}) toward the {teacher} self-teacher re-prompted with "
                        "a successful sibling rollout" + (" or feedback" if record["include_feedback"] else ""))
        return distillation if w == 1 else f"{1 - w:g} x {policy} + {w:g} x {distillation}"

    def card_title(self, record: dict) -> str:
        if record["distillation_weight"] == 0:
            return "# Student trained with rewards (GRPO, no teacher)"
        return "# Student trained with rewards and distilled from itself, re-prompted with its successes (SDPO)"
