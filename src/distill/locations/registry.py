"""The table of teacher locations: where a run's teacher lives, asked in registration order, the fallback last.

A leaf: it imports no location's code (the built-in locations are declared by `distill.parts`, by name, settings
and import path, and imported when first asked for) and refers to the interface
(`distill.locations.base.TeacherLocation`) by its import path, so the config composes the locations' settings
without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.registry import Registry, load_built_in_parts

if TYPE_CHECKING:  # annotations only: this module stays a leaf
    from distill.config import DistillConfig
    from distill.locations.base import TeacherLocation
    from distill.methods.base import Method

LOCATIONS: Registry[TeacherLocation] = Registry("teacher location", "teacher location", load=load_built_in_parts,
                                                interface="distill.locations.base:TeacherLocation")
# The location that holds the teacher when no other claims it, asked last: a model (`distill.locations.model`,
# declared by `distill.parts`), unless a location registered as the fallback replaced it.
_FALLBACK: list[str] = ["model"]


def register_location(location: TeacherLocation | type[TeacherLocation], fallback: bool = False) -> TeacherLocation:
    """Add a location (an instance, or its class: an abstract member left out is refused, named); `fallback`: the one
    that holds the teacher when no other claims it (a model)."""
    added = LOCATIONS.register(location)
    if fallback:
        _FALLBACK[:] = [added.name]
    return added


def unregister_location(name: str) -> None:
    LOCATIONS.unregister(name)


def locations() -> list[TeacherLocation]:
    """Every registered location (their code imported), the fallback last."""
    asked = LOCATIONS.parts()
    return [loc for loc in asked if loc.name not in _FALLBACK] + [loc for loc in asked if loc.name in _FALLBACK]


def location_of(config: DistillConfig, method: Method) -> TeacherLocation:
    """The location that holds this run's teacher: the first that claims it."""
    for location in locations():
        if location.claims(config, method):
            return location
    raise ValueError(f"no teacher location holds the teacher of method {method.name}")
