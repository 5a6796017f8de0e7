"""Methods: what is learned. One module per method, registered in `registry`; this package loads the built-in ones.

Adding a method: write `methods/NAME.py` with a `Method` subclass (its name, summary, sources and objective;
optionally the paper, the fields it reads, validation, metrics, hooks) and `register` an instance, then
import it in `built_in.py`. The built-ins register when the table is first used (`get_method`,
`method_names`), so importing this package loads no method. docs/methods.md walks through it.
"""

from distill.methods import registry
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


def _register_built_in_methods() -> None:
    import distill.methods.built_in  # noqa: F401  (each built-in method registers itself)


registry._METHODS.load_with(_register_built_in_methods)

__all__ = ["Method", "Paper", "Reads", "StepHook", "get_method", "method_names", "register", "unregister"]
