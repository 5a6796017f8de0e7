"""Config fields of multi-turn on-policy distillation (methods on_policy and gkd, with tools or an environment): who
writes each turn of the student's conversations (Guided-OPD), how deep they go (TCOD), how each turn's loss is
weighed (SOD). Read by `distill.methods.multi_turn`; the rules are `distill.agents.guidance` and
`distill.losses.step_weights`."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting


@dataclass
class MultiTurnFields(PartFields):
    guided_turns_probability: float = setting(0.0, "Guided-OPD (arXiv 2606.15912), with tools or an environment: the "
                                              "probability at step 0 that the teacher writes a turn of the student's "
                                              "conversation in its place (drawn per row and turn, the same on every "
                                              "process), decaying linearly to 0 over guided_turns_decay_fraction of "
                                              "max_steps. The teacher continues the conversation's own ids (a teacher "
                                              "model with the student's tokenizer); its turns are attended, not trained. "
                                              "0: every turn is the student's.")
    guided_turns_decay_fraction: float = setting(1.0, "Guided-OPD: the fraction of max_steps over which the guidance "
                                                 "probability falls to 0 (in (0, 1]); after it every turn is the "
                                                 "student's.")
    guided_turns_trained: bool = setting(False, "Guided-OPD: train the teacher's turns too (the divergence at the "
                                         "teacher's own tokens); false: they are context the student's later turns read.")
    depth_curriculum_interval: int = setting(0, "TCOD (arXiv 2604.24005), with tools or an environment: the student's "
                                             "training conversations stop after min(max_turns, 1 + step // interval) "
                                             "turns, one more every `interval` optimizer steps (the paper: 4 to 6). 0: "
                                             "always max_turns. The evaluation's conversations keep max_turns.")
    step_divergence_weighting: bool = setting(False, "SOD (arXiv 2605.07725), with tools or an environment: weigh each "
                                              "turn of the student's conversations by min((d_1 + eps) / (d_k + eps), "
                                              "1 + delta), d_k the turn's mean |log p_student - log p_teacher| of the "
                                              "sampled tokens, d_1 the conversation's first trained turn's.")
    step_divergence_delta: float = setting(0.2, "SOD: a turn's weight is at most 1 + delta (the paper's training "
                                           "script: 0.2).")
    step_divergence_epsilon: float = setting(1e-6, "SOD: eps in (d_1 + eps) / (d_k + eps) (the paper's: 1e-6).")
