"""The asynchronous rollouts feature's settings (`max_staleness` and how stale samples are paced and corrected): a
leaf beside the other settings of samples drawn by older weights (`reuse_fields`), which the methods' corrections
read, composed into `DistillConfig` when the feature is declared (`distill.parts`) and read back typed
(`AsyncFields.of(config)`); its reads and rules are `distill.training.async_feature`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distill.config.io import PartFields, setting


@dataclass
class AsyncFields(PartFields):
    """Rollouts sampled ahead of the weights they train (docs/guides/async.md)."""

    placed_after: ClassVar[str] = "generation_engine"

    max_staleness: int = setting(0, "Optimizer steps the student's rollouts may lag the weights they train: the rollout "
                                 "of step k is sampled by the weights of step k - max_staleness (a worker thread samples "
                                 "it while the steps before k train, from a copy of those weights), so every sample's "
                                 "staleness is exactly min(k, max_staleness) and runs are reproducible. 0: the "
                                 "synchronous loop (docs/guides/async.md).")
    staleness_pacing: str = setting("wait", "With max_staleness > 0: 'wait' (step k's rollout is sampled by the weights of "
                                    "step k - max_staleness, exactly: reproducible, nothing discarded) or 'drop' (the "
                                    "worker samples up to 2 x max_staleness steps ahead from the newest weights it has, "
                                    "without waiting; a rollout staler than max_staleness when its step comes is "
                                    "discarded and sampled again; its samples depend on timing).")
    staleness_correction: str = setting("tis", "With max_staleness > 0, how gkd's, on_policy's and gold's divergences "
                                        "on stale student samples are corrected: 'tis' weighs each token's loss by the "
                                        "importance ratio pi_theta / pi_behaviour truncated at staleness_ratio_cap; "
                                        "'icepop' keeps the ratio inside [1 / cap, cap] and gives no loss outside it; "
                                        "'none'. (A sampled-token loss uses its own PPO ratio against the recorded "
                                        "log-probs, clipped by its own epsilons.)")
    staleness_ratio: str = setting("prefix", "Which importance ratio weighs token t under staleness_correction: "
                                   "'prefix' (the tokens before t: exact for a full-distribution loss), 'sequence' (the "
                                   "whole sample), 'token' (token t's own, verl's TIS).")
    staleness_ratio_cap: float = setting(2.0, "The bound c of staleness_correction: tis truncates the ratio at c, "
                                         "icepop keeps [1 / c, c].")

    def snapshots_held(self, max_steps: int) -> int:
        """How many snapshots of the trainable weights the asynchronous producer holds at once, at most, over a run of
        `max_steps` steps (0 when max_staleness is 0). With pacing wait, step k's rollout samples from version k - s
        and the worker drops a version once it samples from a newer one, so while the trainer waits at step k it holds
        k - s .. k: s + 1; only versions some rollout samples from are made, max(1, max_steps - s) in the whole run.
        Dropping, the worker runs up to 2s steps ahead of the trainer, sampling from the newest version it has, so it
        holds up to 2s + 1 of the max_steps versions made (`distill.training.async_rollout`)."""
        s = self.max_staleness
        if not s:
            return 0
        if self.staleness_pacing == "drop":
            return min(2 * s + 1, max_steps)
        return min(s + 1, max(1, max_steps - s))

