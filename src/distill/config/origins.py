"""Where each config field's value came from: the layers a config is made of, later ones winning.

A config is built from layers over the defaults (the fields' own, and the method's for a field it fills in): a
bundled recipe (`distill train sdft`), a config file the user gave (`distill train my.yaml`), the command line's
flags, or, when a run resumes, the run's recorded config.yaml and the flags given with `--resume`. A layer is the
user's when the user wrote it (their file, their flags, the fields a Python caller passed) and a base when they took
it whole (a bundled recipe, a recorded config). This is the one place that knows, per field, which layer set it.

The config rules read it (`distill.config_rules.reads`): a field that a base set and that the user's own choice made
inert (`--eval_before_after false` on a recipe that names an evaluation set) is noted in one line and ignored; a
field the user set that nothing reads is refused.

A config made any other way (`DistillConfig(...)`, `from_dict`) has no layers: every value in it is the user's, and
so has a copy made with `dataclasses.replace` (a field changed in place, `config.lmbda = 0.0`, keeps the others' layers
and is the user's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

COMMAND_LINE = "the command line"


@dataclass(frozen=True)
class Layer:
    """One source of field values. `name` says it in messages ("recipe sdft", "my.yaml", "the command line");
    `users`: the user wrote these values (False: a base they took whole); `flags`: given as `--name value`."""

    name: str
    values: Mapping[str, Any] = field(default_factory=dict)
    users: bool = True
    flags: bool = False

    def quote(self, name: str) -> str:
        """How the user wrote field `name` in this layer: `--eval_before_after false`, or `eval_before_after: false in
        my.yaml`."""
        value = self.values[name]
        if self.flags:
            return f"--{name} {written(value)}"
        return f"{name}: {written(value)} in {self.name}"


def written(value: Any) -> str:
    """A value as a user writes it on the command line or in YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) if value else '""'
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class Origins:
    """The layers of a config, in the order they were applied (later ones win)."""

    layers: tuple[Layer, ...] = ()

    def layer_of(self, name: str, value: Any) -> Layer | None:
        """The layer that set field `name` to `value` (the config's value): the last layer naming the field, if the
        config still holds what it set. None: no layer set it, or the value was changed afterwards (by the user)."""
        for layer in reversed(self.layers):
            if name in layer.values:
                return layer if layer.values[name] == value else None
        return None

    def set_by_base(self, name: str, value: Any) -> Layer | None:
        """The base layer (a recipe, a recorded config) whose value field `name` holds, or None when the user's."""
        layer = self.layer_of(name, value)
        return layer if layer is not None and not layer.users else None

    def base_value(self, name: str, default: Any) -> Any:
        """The value field `name` would have without the user's layers: the last base layer's, else `default`."""
        for layer in reversed(self.layers):
            if not layer.users and name in layer.values:
                return layer.values[name]
        return default


NO_ORIGINS = Origins()
