"""Reading config values from YAML recipes and command-line strings: parsing, unknown names, type coercion.

Generic over the config dataclass (passed in), so it imports nothing of distill.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from distill import registry

PartFieldsT = TypeVar("PartFieldsT", bound="PartFields")


@dataclasses.dataclass
class PartFields:
    """A part's own settings (a method's, a teacher location's, a generation engine's): subclass it as a dataclass of
    `setting(...)` fields with defaults and declare it on the part (`fields`). Registering the part composes them into
    `DistillConfig`, flat (`distill.config`); `of(config)` reads them back typed, as the part's code does.

    placed_after: the config field after which these fields appear in the flat namespace (config.yaml, `--help`); None:
    after every field known before them (a run feature's settings keep the place they had in the core's)."""

    placed_after: ClassVar[str | None] = None

    @classmethod
    def of(cls: type[PartFieldsT], config: Any) -> PartFieldsT:
        """This part's fields of `config`, as an instance of the settings class (a copy: the config is not changed)."""
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})


def setting(default: Any, help: str, **kwargs: Any) -> Any:
    """A config field with its help text (read by `--help` and the field help); list and dict defaults are
    copied per config."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help, **kwargs})
    return dataclasses.field(default=default, metadata={"help": help, **kwargs})


OBJECT_RECORD = re.compile(r"<\w+ object>")  # how config.yaml records a model or dataset passed as an object


def load_yaml_recipe(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"recipe {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"recipe {path} is not valid YAML: {error}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"recipe {path} must be a mapping of config fields to values, got {type(values).__name__}")
    return dict(values)


def typed_values(config_class, values: dict[str, Any], where: str) -> dict[str, Any]:
    """`values` checked against `config_class`'s fields (an unknown name suggests the closest) and coerced."""
    for name in values:
        if name not in field_names(config_class):
            raise ValueError(unknown_field_message(config_class, name, where))
    return {name: coerce(config_class, name, value, where) for name, value in values.items()}


def field_names(config_class) -> list[str]:
    return [f.name for f in dataclasses.fields(config_class)]


def unknown_field_message(config_class, name: str, where: str) -> str:
    retired = getattr(config_class, "RETIRED_FIELDS", {}).get(name.replace("-", "_"))
    if retired is not None:
        return f"{where}: {retired}"
    close = difflib.get_close_matches(name.replace("-", "_"), field_names(config_class), n=1, cutoff=0.5)
    hint = f"; did you mean '{close[0]}'?" if close else "; `distill train --help` lists the fields"
    return f"{where}: unknown config field '{name}'{hint}"


def coerce(config_class, name: str, value: Any, where: str = "config") -> Any:
    """Convert a YAML/CLI value to the field's type; strings from the command line are parsed."""
    annotation = {f.name: f.type for f in dataclasses.fields(config_class)}[name]
    hints = typing.get_type_hints(config_class)
    for part in registry.part_fields():  # a registered part's settings are not in the class's bases
        if name in {f.name for f in dataclasses.fields(part)}:
            hints = typing.get_type_hints(part)
    target = hints.get(name, annotation)
    optional = _is_optional(target)
    base = _strip_optional(target)
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ValueError(f"{where}: field '{name}' cannot be empty")
    if base is dict:
        return mapping_value(name, value, where)
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError
        if base is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is list:
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            return list(value)

        if base is str:
            if isinstance(value, dict) and name in ("teacher_url", "teacher_cache"):
                return ",".join(f"{k}={v}" for k, v in value.items())
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        pass
    raise ValueError(f"{where}: field '{name}' expects {getattr(base, '__name__', base)}, got {value!r}")


def mapping_value(name: str, value: Any, where: str) -> dict[str, Any] | None:
    """A mapping field's value: a mapping (YAML), or its JSON text (a flag); keys are text. None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: field '{name}' expects a mapping as JSON (e.g. '{{\"enable_thinking\": false}}'), "
                             f"got {value!r} ({error.msg})") from None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{where}: field '{name}' expects a mapping of names to values, got {value!r}")
    return dict(value)


def _is_optional(tp: Any) -> bool:
    return isinstance(tp, types.UnionType) and type(None) in tp.__args__ or (
        getattr(tp, "__origin__", None) is typing.Union and type(None) in tp.__args__
    )


def _strip_optional(tp: Any) -> Any:
    if _is_optional(tp):
        return next(a for a in tp.__args__ if a is not type(None))
    return tp


