"""sdpo: self-distilled policy optimization (Hübotter et al., 2026, arXiv 2601.20802); GRPO at distillation_weight 0.

RL with rewards in which the failed rollouts also learn from a self-teacher: the same model re-prompted
with a successful sibling rollout (and/or environment feedback) as privileged context. Per step:

  1. the student samples num_generations completions per prompt (`distill.data.StepSampler` groups);
  2. the reward stage (`distill.methods.sdpo.stage`) scores them, computes group advantages, mines each rollout's
     demonstration from its group across all processes and writes the self-teacher's prompts;
  3. loss = (1 - w) group policy loss (loss_type) + w self-distillation (the SDFT losses, on the rows
     with a demonstration or feedback), `distill.objectives.sdpo`.

With distillation_weight 0 it is GRPO (Shao et al., 2024): the RL baseline SDPO is measured against, with
no self-teacher built and no teacher pass.

The package: `method.py` (the `Method`: sources, objective, validation, hooks), `stage.py` (the step stage:
rewards, advantages, demonstrations), `rewards.py` (reward functions), `fields.py` (the config fields it
reads), `reprompts.py` (the self-teacher's prompts). Importing the package loads none of them (the
config imports `fields` and `reprompts`' default templates without torch).
"""
