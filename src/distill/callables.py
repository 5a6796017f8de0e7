"""Python callables named by import path in a config ('package.module:function'), as reward functions and tools are.

A leaf: it imports nothing from distill. The field that names the callable is in every message.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def import_callable(spec: str, field: str) -> Callable[..., Any]:
    """The callable 'package.module:attribute[.attribute]' names; ValueError naming `field` when it does not resolve."""
    if ":" not in spec:
        raise ValueError(f"{field}: {spec!r} is not an import path 'package.module:function'")
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or the module raising while it loads
        raise ValueError(f"{field}: cannot import {module_name!r} for {spec!r} ({type(error).__name__}: {error}); "
                         "is the package installed, or its directory on PYTHONPATH?") from None
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise ValueError(f"{field}: {module_name!r} has no callable {attribute!r} (from {spec!r})")
    return found
