"""Config fields of method sdpo: groups, rewards, advantages, demonstrations (read by `distill.methods.sdpo`)."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting
from distill.methods.sdpo.reprompts import (
    DEFAULT_FEEDBACK_TEMPLATE,
    DEFAULT_REPROMPT_TEMPLATE,
    DEFAULT_SOLUTION_TEMPLATE,
)


@dataclass
class SdpoFields(PartFields):
    num_generations: int = setting(8, "method sdpo: G, completions sampled per prompt (a group). A step holds "
                                   "per_device_train_batch_size x gradient_accumulation_steps x processes completions, a "
                                   "multiple of G; a group may span micro-batches and processes.")
    reward_funcs: list = setting(["contains_answer"], "method sdpo: reward functions, summed with reward_weights: built-ins "
                                 "'contains_answer' / 'equals_answer' (the row's `answer`, normalised: 1 or 0), 'regex' "
                                 "(matches reward_regex), or 'package.module:function' called as f(prompts, completions, "
                                 "rows) -> one float per completion (rows: dicts of every dataset column). Comma-separated "
                                 "on the command line.")
    reward_weights: list | None = setting(None, "method sdpo: one weight per reward function (None: all 1).")
    reward_regex: str | None = setting(None, "method sdpo, reward 'regex': the pattern a rewarded completion matches (re.search).")
    advantage_scaling: str = setting("group", "method sdpo: A = (r - group mean) / (std + 1e-4) with the group's std "
                                     "('group'), the step's ('batch'), or A = r - group mean ('none').")
    loss_type: str = setting("dapo", "method sdpo: normalisation of the policy loss: 'grpo' (each row's token mean, "
                             "averaged over rows), 'dr_grpo' (token sum / (rows x max_new_tokens)), 'dapo' (token sum / "
                             "the step's tokens over all processes), 'bnpo' (each micro-batch's token mean, averaged).")
    distillation_weight: float = setting(1.0, "method sdpo: w in loss = (1 - w) policy + w self-distillation. 0 is GRPO "
                                         "(no self-teacher); 1 is pure self-distillation, SDPO's default.")
    success_reward_threshold: float = setting(1.0, "method sdpo: a rollout whose reward reaches this is a success, shown "
                                              "to its failed siblings' self-teacher as a demonstration.")
    demonstration_from_self: bool = setting(False, "method sdpo: a successful rollout may be its own demonstration "
                                            "(False: only a sibling's; a lone success in its group gets none).")
    include_feedback: bool = setting(False, "method sdpo: re-prompt the self-teacher with the row's `feedback` column "
                                     "(else its `privileged_context`) too, where it has one.")
    feedback_only_without_solution: bool = setting(False, "method sdpo, include_feedback: use the feedback only for "
                                                   "rollouts without a successful sibling.")
    reprompt_template: str = setting(DEFAULT_REPROMPT_TEMPLATE, "method sdpo: the self-teacher's prompt, with {prompt}, "
                                     "{solution} and {feedback} (each block empty when absent); a chat prompt's last user "
                                     "turn becomes it.")
    solution_template: str = setting(DEFAULT_SOLUTION_TEMPLATE, "method sdpo: the {solution} block, around {demonstration} "
                                     "(the successful sibling's completion text).")
    feedback_template: str = setting(DEFAULT_FEEDBACK_TEMPLATE, "method sdpo: the {feedback} block, around {feedback}.")
    remove_thinking_from_demonstration: bool = setting(False, "method sdpo: cut <think>...</think> from demonstrations.")
    max_reprompt_length: int = setting(1024, "method sdpo: self-teacher prompts longer than this many tokens are cut, "
                                       "keeping their end (logged as self_teacher/prompt_truncated).")
