"""Where the teacher lives, one module per location (`distill.locations.base` is the interface):

    location  module            chosen by                     signal it gives
    model     model.py          `teacher` (the fallback)      dense (same tokenizer) or aligned (cross_tokenizer)
    server    server.py         `teacher_url`                 sparse: top-k log-probs + the token's, over HTTP; dense
                                                            (aligned for gold) with teacher_payload: hidden
    cache     cache.py          `teacher_cache`               sparse, or dense with teacher_payload: hidden, from
                                                            `distill cache-teacher` output
    (remote.py: what server and cache share: the payload, the fields' ranges)
    self      student_itself.py a method with teacher "self"  dense: the student's weights shown privileged context
    none      no_teacher.py     a method with teacher "none"  nothing (sft)

A method works with a location when its objective consumes that location's signal kind. A new location is a
`TeacherLocation` subclass passed to `register_location` (docs/methods.md walks through one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.locations.base import (
    CACHE,
    EVAL,
    TRAIN,
    TeacherLocation,
    TeacherRequest,
    Teachers,
    location_of,
    locations,
    register_location,
    unregister_location,
)
from distill.locations.cache import CacheLocation
from distill.locations.model import ModelLocation
from distill.locations.no_teacher import NoTeacher
from distill.locations.routes import parse_routes
from distill.locations.server import ServerLocation
from distill.locations.student_itself import SelfLocation

if TYPE_CHECKING:
    from distill.config import DistillConfig

for _location in (SelfLocation(), NoTeacher(), CacheLocation(), ServerLocation()):
    register_location(_location)
register_location(ModelLocation(), fallback=True)


def validate(config: DistillConfig, method, sources: frozenset[str]) -> None:
    """The teacher's location against the method (its objective's signals, its completion sources)."""
    named = [loc.selected_by[0] for loc in locations() if loc.selected_by and getattr(config, loc.selected_by[0]) is not None]
    if len(named) > 1:
        raise ValueError(f"{' and '.join(sorted(named, reverse=True))}: a run has one teacher location; set one of them")
    location_of(config, method).validate(config, method, sources)


def location_reads() -> tuple:
    """Every registered location's `reads` (the fields a run reads, `distill.config.reads`)."""
    return tuple(part for location in locations() for part in location.reads)


__all__ = ["CACHE", "EVAL", "TRAIN", "TeacherLocation", "TeacherRequest", "Teachers", "location_of", "location_reads",
           "locations", "parse_routes", "register_location", "unregister_location", "validate"]
