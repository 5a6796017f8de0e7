"""Methods: what is learned. One module per method, declared in the catalogue (`distill.parts`) and kept in the
table of `base`; importing this package loads no method.

Adding a method: write `methods/NAME.py` with a `Method` subclass (its name, summary, sources and objective;
optionally the paper, the fields it reads, validation, metrics, hooks), then either `register` it (a method of
your own) or, for a built-in, declare it in `distill.parts` by name, settings and import path. The built-ins'
code is imported when a method is first asked for (`get_method`); `method_names` imports none. docs/methods.md
walks through it.
"""

from distill.methods.base import (
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
