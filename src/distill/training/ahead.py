"""Moved to `distill.training.async_rollout` (the asynchronous rollout producer, `AsyncRollout`); this name stays only
while `distill.config.checks` reads `PACINGS` from here."""

from distill.training.async_rollout import PACINGS

__all__ = ["PACINGS"]
