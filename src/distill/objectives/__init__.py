"""Objectives: what a method learns from a teacher signal. Chosen by the method, never by the teacher.

- `DivergenceObjective` / `divergence`: generalized JSD (dense, sparse) or ULD (aligned); also the evaluation's.
- `per_teacher`: routing for any objective when several teachers share a micro-batch.
- `StudentTokens`, `StepContext`, `Objective`: the interface (objectives/base.py).
"""

from distill.objectives.base import Objective, StepContext, StudentTokens
from distill.objectives.divergence import DivergenceObjective, LossSettings, divergence
from distill.objectives.routing import per_teacher

__all__ = ["DivergenceObjective", "LossSettings", "Objective", "StepContext", "StudentTokens", "divergence", "per_teacher"]
