"""Config fields of gkd's mixing of completion sources (methods gkd and gold; read by `distill.methods.mixing`)."""

from __future__ import annotations

from dataclasses import dataclass

from distill.config.io import PartFields, setting

LMBDA_SCHEDULES = ("constant", "linear", "step")


@dataclass
class MixingFields(PartFields):
    lmbda: float = setting(0.5, "Probability that a micro-batch is on-policy (student samples its completions); "
                           "the rest use dataset completions, or the teacher's with `seq_kd`. Drawn once per "
                           "micro-batch, identically on every process.")
    lmbda_schedule: str = setting("step", f"How lmbda moves over optimizer steps: {LMBDA_SCHEDULES}. 'linear' "
                                  "goes from `lmbda_start` to `lmbda` over `lmbda_schedule_steps`; 'step' uses "
                                  "`lmbda_start` before step `lmbda_schedule_steps` and `lmbda` from it on.")
    lmbda_start: float = setting(0.0, "lmbda at step 0 for the 'linear' and 'step' schedules.")
    lmbda_schedule_steps: int = setting(54, "Length of the lmbda ramp ('linear') or the switch step ('step').")
    seq_kd: bool = setting(True, "Sequence-level KD: off-policy micro-batches use completions sampled by the "
                           "teacher instead of the dataset's (works for prompt-only datasets).")
    off_policy_beta: float | None = setting(0.0, "beta for dataset and teacher completions; None = `beta`. "
                                            "Forward KL (0) is the natural loss on teacher samples.")
