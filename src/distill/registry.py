"""A table of named parts (methods, generation engines): one way to register, list and look them up.

A leaf module: it imports nothing from distill, so any part's own module (itself a leaf, like
`distill.methods.registry`) can hold a table.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Parts by their `name` attribute. `field`: the config field that names one (for messages); `kind`: what a part is called
    ("method"); `retired`: names that once were parts, with what to write instead; `also`: names the field
    accepts besides the parts (e.g. "auto"), which no part may take; `order`: a sort key for `names()`
    (registration order when None)."""

    def __init__(self, field: str, kind: str, retired: dict[str, str] | None = None, also: tuple[str, ...] = (),
                 order: Callable[[str, T], object] | None = None, load: Callable[[], None] | None = None,
                 settings: Callable[[T], type | tuple[type, ...] | None] | None = None):
        """`settings(part)`: the part's own settings, a class or a tuple of classes (`part_fields`; several parts may
        share one), composed into the config while it is registered; None: the parts of this table have none."""
        self.field, self.kind, self.retired, self.also, self.order = field, kind, retired or {}, also, order
        self.settings = settings
        self._parts: dict[str, T] = {}
        self._load = load  # registers the built-in parts, once, before the table is first used

    def _loaded(self) -> dict[str, T]:
        if self._load is not None:
            load, self._load = self._load, None
            load()
        return self._parts

    def load_with(self, load: Callable[[], None]) -> None:
        """Register the built-in parts with `load()` when the table is first used (once)."""
        self._load = load

    def register(self, part: T) -> T:
        """Add `part` under its `name` (a name may be registered once), and its own settings (refused: not added)."""
        name = part.name
        if name in self._loaded() or name in self.retired or name in self.also:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        fields = self._settings_of(part)
        for index, fields_class in enumerate(fields):
            try:
                add_part_fields(fields_class)  # composed into DistillConfig (`distill.config`)
            except Exception:
                for added in fields[:index]:
                    remove_part_fields(added)
                raise
        self._parts[name] = part
        return part

    def _settings_of(self, part: T) -> tuple[type, ...]:
        declared = self.settings(part) if self.settings is not None and part is not None else None
        if declared is None:
            return ()
        return tuple(declared) if isinstance(declared, (tuple, list)) else (declared,)

    def unregister(self, name: str) -> None:
        """Remove a part and its own settings (tests that register a toy clean up with this)."""
        part = self._loaded().pop(name, None)
        if part is not None:
            for fields_class in self._settings_of(part):
                remove_part_fields(fields_class)

    def names(self) -> tuple[str, ...]:
        self._loaded()
        if self.order is None:
            return tuple(self._parts)
        return tuple(sorted(self._parts, key=lambda name: self.order(name, self._parts[name])))

    def get(self, name: str) -> T:
        """The part `name`; a retired or unknown name is a ValueError that says what to write."""
        if name in self.retired:
            raise ValueError(self.retired[name])
        if name not in self._loaded():
            close = difflib.get_close_matches(str(name), list(self._parts) + list(self.also), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            accepted = "".join(f"{word!r} or " for word in self.also)
            raise ValueError(f"{self.field} must be {accepted}one of {self.names()}, got {name!r}{hint}")
        return self._parts[name]


# ------------------------------------------------------------------------------------- part settings --
# The settings of registered parts (a dataclass of fields each, built-in parts' and others' alike): the registries
# add them here, and the config (`distill.config`), which listens, composes `DistillConfig` from them. Several parts
# may declare one class (gkd and gold share the mixing fields): it is counted, and leaves with the last of them. The
# registries import only this leaf, so no import circle runs from a part's registration to the config.
_PART_FIELDS: dict[type, int] = {}  # settings class -> parts registered that declare it (insertion order kept)
_LISTENERS: list[Callable[[], None]] = []


def part_fields() -> tuple[type, ...]:
    """The registered parts' settings classes, in the order they were first registered."""
    return tuple(_PART_FIELDS)


def add_part_fields(fields_class: type) -> None:
    """Register a part's settings; a listener that refuses them (a name clash) raises, and they are not added."""
    if fields_class in _PART_FIELDS:
        _PART_FIELDS[fields_class] += 1
        return
    _PART_FIELDS[fields_class] = 1
    try:
        _tell_listeners()
    except Exception:
        del _PART_FIELDS[fields_class]
        _tell_listeners()
        raise


def remove_part_fields(fields_class: type) -> None:
    """One part declaring `fields_class` left; the settings go with the last of them."""
    if fields_class not in _PART_FIELDS:
        return
    _PART_FIELDS[fields_class] -= 1
    if _PART_FIELDS[fields_class] == 0:
        del _PART_FIELDS[fields_class]
        _tell_listeners()


def _tell_listeners() -> None:
    for listener in _LISTENERS:
        listener()


def on_part_fields(listener: Callable[[], None]) -> None:
    """Call `listener()` now and whenever the registered settings change."""
    _LISTENERS.append(listener)
    listener()
