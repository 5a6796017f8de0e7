"""Config fields of method iw_opd: prefix-decayed weights and the teacher warm-up (read by `distill.methods.iw_opd`)."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting


@dataclass
class IwOpdFields(PartFields):
    iw_opd_gamma: float = setting(0.5, "method iw_opd: prefix decay of the token weights w_t = 1 + gamma (1 - P_t / S), "
                                  "where P_t is the |advantage| before token t in its sequence and S the sequence's "
                                  "total; 0 = plain sampled-token OPD (every weight 1).")
    iw_opd_epsilon: float = setting(1e-8, "method iw_opd: floor of S in the token weights (a sequence the teacher "
                                    "fully agrees with has S = 0).")
    teacher_warmup_steps: int = setting(0, "method iw_opd: optimizer steps at the start trained with forward KL on "
                                        "teacher-sampled completions (sequence-level KD, a fresh student's own samples "
                                        "are noise) before the policy gradient on the student's samples takes over; with "
                                        "num_iterations > 1, rounded up to whole rollouts.")
