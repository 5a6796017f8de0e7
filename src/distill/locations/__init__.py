"""Where the teacher lives, one module per location (`distill.locations.base` is the interface):

    location  module            chosen by                     signal it gives
    model     model.py          `teacher` (the fallback)      dense (same tokenizer) or aligned (cross_tokenizer)
    server    server.py         `teacher_url`                 sparse: top-k log-probs + the token's, over HTTP; dense
                                                            (aligned for gold) with teacher_payload: hidden
    cache     cache.py          `teacher_cache`               sparse, or dense with teacher_payload: hidden, from
                                                            `distill cache-teacher` output
    (remote.py: what server and cache share: the payload, the fields' ranges)
    self      self_teacher.py   a method with teacher "self"  dense: the student's weights shown privileged context
    none      no_teacher.py     a method with teacher "none"  nothing (sft)

A method works with a location when its objective consumes that location's signal kind. A new location is a
`TeacherLocation` subclass passed to `register_location` (docs/methods.md walks through one); the built-in ones are
declared by `distill.parts` (name, settings, import path) and imported when first asked for, so importing this
package imports no location (the interface's names, `TeacherLocation` and the rest, are imported when read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distill.locations.registry import location_of, locations, register_location, unregister_location
from distill.locations.routes import parse_routes

if TYPE_CHECKING:  # what `__getattr__` gives, for the type checker
    from distill.locations.base import CACHE, EVAL, TRAIN, TeacherLocation, TeacherRequest, Teachers

_INTERFACE = ("CACHE", "EVAL", "TRAIN", "TeacherLocation", "TeacherRequest", "Teachers")


def __getattr__(name: str) -> Any:
    """The interface's names (`distill.locations.base`, which imports the teachers' code), imported when read."""
    if name in _INTERFACE:
        from distill.locations import base

        return getattr(base, name)
    raise AttributeError(f"module 'distill.locations' has no attribute {name!r}")


__all__ = ["CACHE", "EVAL", "TRAIN", "TeacherLocation", "TeacherRequest", "Teachers", "location_of", "locations",
           "parse_routes", "register_location", "unregister_location"]
