"""A table of named parts (methods, teacher locations, generation engines, model kinds, run features): one way to
register, list and look them up.

A part is known by its name, its settings (leaf dataclasses, composed into `DistillConfig` as soon as the part is
known) and its implementation. The built-in parts are *declared* (`Registry.declare`: name, settings, and the import
path of the implementation, "package.module:Class"), like vLLM's model registry: their code is imported, the class
checked against the table's interface and instantiated, only when the part is first used (`get`, `parts`). A part
made elsewhere (a user's, a test's toy) is *registered* as an object (`Registry.register`). Either way a part is
checked against the table's interface, an abstract base class named by its import path: a class that leaves an
abstract member unimplemented is refused with a message naming it.

A leaf module: it imports nothing from distill, so any part's own leaf module (`distill.methods.base`) can
hold a table, and `distill.config` can compose the settings without importing a part's code (or torch).
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Generic, Protocol, TypeVar


@dataclass(frozen=True)
class Reads:
    """Config fields a part of a run reads while `when(config)` holds; `needs` names what turns them on
    (it completes the sentence "X is only read with ...")."""

    needs: str
    names: tuple[str, ...]
    when: Callable[[Any], bool] = lambda config: True


class Part(Protocol):
    """What every table's parts declare: the name the config and messages use, and their own settings (`fields`:
    a settings class, a tuple of them, or none)."""

    @property
    def name(self) -> str: ...

    @property
    def fields(self) -> object: ...


T = TypeVar("T", bound=Part)


def resolve(path: str) -> Any:
    """The object at import path `path`: "package.module:attribute" (imported now) or "package.module"."""
    module, _, attribute = path.partition(":")
    found: Any = importlib.import_module(module)
    for name in filter(None, attribute.split(".")):
        found = getattr(found, name)
    return found


def settings_tuple(declared: object) -> tuple[type, ...]:
    """A part's `fields` (one settings class, a tuple or list of them, or nothing) as a tuple."""
    if not declared:
        return ()
    if isinstance(declared, (tuple, list)):
        return tuple(declared)
    if isinstance(declared, type):
        return (declared,)
    raise TypeError(f"a part's settings are a class or a tuple of classes, got {declared!r}")


@dataclass(frozen=True)
class Declared:
    """A built-in part known before its code is imported: its name, its settings classes and the import path of
    its implementation ("package.module:Class", instantiated with no arguments when first used)."""

    name: str
    path: str
    settings: tuple[type, ...]


class Registry(Generic[T]):
    """Parts by their `name` attribute. `field`: the config field that names one (for messages); `kind`: what a part is called
    ("method"); `retired`: names that once were parts, with what to write instead; `also`: names the field
    accepts besides the parts (e.g. "auto"), which no part may take; `order`: a sort key for `names()`
    (registration order when None; it sees the part, so ordering by it imports the declared parts' code);
    `interface`: the import path of the abstract base class every part implements ("distill.methods.base:Method"),
    resolved when a part is first checked; `check(part)`: the table's own rules for a part, after the interface's (a
    function, or its import path when it lives beside the interface)."""

    def __init__(self, field: str, kind: str, retired: dict[str, str] | None = None, also: tuple[str, ...] = (),
                 order: Callable[[str, T], Any] | None = None, load: Callable[[], object] | None = None,
                 interface: str | None = None, check: Callable[[T], object] | str | None = None):
        self.field, self.kind, self.retired, self.also, self.order = field, kind, retired or {}, also, order
        self.interface, self.check = interface, check
        self._parts: dict[str, T | Declared] = {}
        self._load = load  # declares the built-in parts, once, before the table is first used

    def _loaded(self) -> dict[str, T | Declared]:
        if self._load is not None:
            load, self._load = self._load, None
            load()
        return self._parts

    # ------------------------------------------------------------------------------------ adding --
    def declare(self, name: str, path: str, settings: type | tuple[type, ...] = ()) -> None:
        """Know the part `name` by its settings (composed into the config now) and the import path of its class
        (imported, checked and instantiated when the part is first used)."""
        self._add(name, Declared(name, path, settings_tuple(settings)))

    def register(self, part: T | type) -> T:
        """Add `part` (an instance, or a class instantiated with no arguments) under its `name` (a name may be
        registered once), and its own settings; one that does not implement the table's interface is refused (not
        added)."""
        part = self._checked(part)
        self._add(part.name, part)
        return part

    def _add(self, name: str, entry: T | Declared) -> None:
        if name in self._loaded() or name in self.retired or name in self.also:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        fields = self._settings_of(entry)
        for index, fields_class in enumerate(fields):
            try:
                add_part_fields(fields_class)  # composed into DistillConfig (`distill.config`)
            except Exception:
                for added in fields[:index]:
                    remove_part_fields(added)
                raise
        self._parts[name] = entry

    def _checked(self, part: T | type) -> T:
        """`part` checked against the interface (a class: its abstract members; then instantiated) and `check`."""
        cls = part if isinstance(part, type) else type(part)
        if self.interface is not None:
            interface = resolve(self.interface)
            if not issubclass(cls, interface):
                raise TypeError(f"{cls.__name__} is not a {self.interface.replace(':', '.')}; subclass it to register "
                                f"a {self.kind}")
            missing = sorted(getattr(cls, "__abstractmethods__", ()))
            if missing:
                raise TypeError(f"the {self.kind} {cls.__name__} does not implement {', '.join(missing)} (abstract in "
                                f"{interface.__name__}); it is not registered")
        instance: T = part() if isinstance(part, type) else part
        if self.check is not None:
            (resolve(self.check) if isinstance(self.check, str) else self.check)(instance)
        return instance

    def _settings_of(self, entry: T | Declared) -> tuple[type, ...]:
        if isinstance(entry, Declared):
            return entry.settings
        return settings_tuple(entry.fields)

    def unregister(self, name: str) -> None:
        """Remove a part and its own settings (tests that register a toy clean up with this)."""
        entry = self._loaded().pop(name, None)
        if entry is not None:
            for fields_class in self._settings_of(entry):
                remove_part_fields(fields_class)

    # ----------------------------------------------------------------------------------- reading --
    def names(self) -> tuple[str, ...]:
        """The parts' names (declared parts' code is not imported, unless `order` needs the parts)."""
        names = tuple(self._loaded())
        if self.order is None:
            return names
        return tuple(sorted(names, key=lambda name: self.order(name, self.get(name))))  # type: ignore[misc]

    def declared(self, name: str) -> bool:
        """Whether `name` is a part known by name and not yet imported."""
        return isinstance(self._loaded().get(name), Declared)

    def get(self, name: str) -> T:
        """The part `name` (a declared part's code imported now); a retired or unknown name is a ValueError that
        says what to write."""
        if name in self.retired:
            raise ValueError(self.retired[name])
        if name not in self._loaded():
            close = difflib.get_close_matches(str(name), list(self._parts) + list(self.also), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            accepted = "".join(f"{word!r} or " for word in self.also)
            raise ValueError(f"{self.field} must be {accepted}one of {self.names()}, got {name!r}{hint}")
        entry = self._parts[name]
        if isinstance(entry, Declared):
            entry = self._imported(entry)
        return entry

    def parts(self) -> list[T]:
        """Every part, in the order of `names()` (the declared ones' code imported)."""
        return [self.get(name) for name in self.names()]

    def _imported(self, declared: Declared) -> T:
        part = self._checked(resolve(declared.path))
        if part.name != declared.name:
            raise TypeError(f"{declared.path} is declared as the {self.kind} {declared.name!r} but is named "
                            f"{part.name!r}")
        own = settings_tuple(part.fields)
        if own != declared.settings:
            raise TypeError(f"{declared.path} declares the settings {[c.__name__ for c in own]}, its declaration "
                            f"{[c.__name__ for c in declared.settings]}: make them the same")
        self._parts[declared.name] = part
        return part


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


# -------------------------------------------------------------------------------------- the built-ins --
# The catalogue that declares every built-in part, named by import path: the tables (each in its part's leaf module)
# load it when first used and the config before its first instance, and none of them imports up to it.
BUILT_IN_PARTS = "distill.parts:load"


def load_built_in_parts() -> bool:
    """Declare the built-in parts (once); True when this call declared them."""
    return bool(resolve(BUILT_IN_PARTS)())


# ------------------------------------------------------------------------------------- config rules --
# `DistillConfig.validate()` runs rules that know every registered part, so they live above the parts (the catalogue
# registers them by import path, `distill.parts`); the config reaches them through here, importing nothing upward.
_CONFIG_RULES: list[str] = []


def register_config_rules(path: str) -> None:
    """The import path of the function `validate(config) -> config` that `DistillConfig.validate()` calls."""
    _CONFIG_RULES[:] = [path]


def config_rules() -> Callable[[Any], Any]:
    """The registered config rules (the built-in parts declared first: they register them)."""
    load_built_in_parts()
    if not _CONFIG_RULES:
        raise RuntimeError("no config rules are registered (distill.parts registers them)")
    return resolve(_CONFIG_RULES[0])
