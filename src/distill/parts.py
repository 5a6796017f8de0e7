"""The built-in parts, registered: every method, teacher location and generation engine distill ships.

`DistillConfig` is composed from the registered parts' settings (`distill.config`): it calls `load()` before its
fields are first needed (a config made, its fields listed), so `import distill.config` stays light. The methods come
first, then the locations and the engines: the order of their settings in config.yaml and `--help`.
"""

from __future__ import annotations

_state = {"loaded": False}


def load() -> bool:
    """Register the built-in parts, once (a second call, or one made while they register, does nothing); True when
    this call registered them."""
    if _state["loaded"]:
        return False
    _state["loaded"] = True
    try:
        from distill import generation, locations, methods

        methods.method_names()  # the method table registers its built-ins when first used
        locations.locations()
        generation.engine_names()
    except BaseException:
        _state["loaded"] = False
        raise
    return True
