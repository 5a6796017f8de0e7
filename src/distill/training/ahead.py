"""Moved: the asynchronous rollout producer is `distill.training.async_rollout.AsyncRollout`, its pacings
`distill.training.plan.PACINGS`. This name stays only while `distill.config.checks` reads `PACINGS` from here."""

from distill.training.plan import PACINGS

__all__ = ["PACINGS"]
