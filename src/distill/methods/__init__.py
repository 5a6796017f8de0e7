"""Methods: what is learned. One module per method, registered in `registry`; this package loads the built-in ones.

Adding a method: write `methods/NAME.py` with a `Method` subclass (its name, summary, sources and objective;
optionally the paper, the fields it reads, validation, metrics, hooks) and `register` an instance, then
import it below. docs/methods.md walks through it.
"""

from distill.methods import gkd, gold, iw_opd, on_policy, sdft, sdpo, sft  # noqa: F401  (each registers itself)
from distill.methods.registry import (
    Method,
    Paper,
    Reads,
    StepHook,
    get_method,
    method_names,
    register,
    unregister,
)

__all__ = ["Method", "Paper", "Reads", "StepHook", "get_method", "method_names", "register", "unregister"]
