"""Fields nothing reads, by who set them: the user's are refused; a recipe's that the user's own choice made inert
are ignored, with a note.

`distill train sdft --eval_before_after false`: the recipe names an evaluation set, the user turned the evaluation
off. Refusing would make the user edit a recipe they did not write to turn off a part of it; ignoring silently
would hide that a value they may count on is gone. So: one line per such field, naming the field, the layer that
set it and what made it inert ("note: eval_dataset, eval_max_new_tokens (set by recipe sdft) are not read because of
--eval_before_after false; ignored"), and the field back at its default in the resolved config (config.yaml records what the run
read; a resumed run does not stumble on it). A field that the user set (a flag, their own config file, a Python
argument) and that nothing reads is still an error, as is one that a base set when nothing the user set is the
cause. The same holds for a teacher location: the user's `--teacher_url` displaces a recipe's `teacher_cache`. Which
layer set a field: `distill.config.origins`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distill.config.origins import written
from distill.config_rules.reads import Unread, field_default, read_by, unread_fields
from distill.locations.registry import locations
from distill.methods.base import Method, get_method

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.config.origins import Layer, Origins


@dataclass(frozen=True)
class Ignored:
    """A field a base layer set that the user's own choice (`cause`: how the user wrote it) made inert."""

    name: str
    layer: Layer
    cause: str


def notes(ignored: list[Ignored]) -> list[str]:
    """One line per layer and cause: "note: eval_dataset, eval_max_new_tokens (set by recipe sdft) are not read because
    of --eval_before_after false; ignored"."""
    groups: dict[tuple[str, str], list[str]] = {}
    for field in ignored:
        groups.setdefault((field.layer.name, field.cause), []).append(field.name)
    return [f"note: {', '.join(names)} (set by {layer}) {'is' if len(names) == 1 else 'are'} not read because of {cause}; "
            "ignored" for (layer, cause), names in groups.items()]


def with_method_defaults(config: DistillConfig, method: Method) -> DistillConfig:
    """`config` with `method`'s defaults in the fields left at None (a copy)."""
    return dataclasses.replace(config, **{name: value for name, value in method.defaults.items()
                                          if getattr(config, name) is None})


def drop_inert(config: DistillConfig, raw: DistillConfig, method: Method, sources: frozenset[str]
               ) -> tuple[DistillConfig, list[Ignored]]:
    """(`config` with every field that a base layer set and a field of the user's made inert back at its default, those
    fields). `raw`: the config as its layers made it (before the method's defaults), whose `origins` say who set what.
    Any other unread field is left for `distill.config_rules.reads.check_fields_read` to refuse."""
    config, ignored = _displaced_location(config, raw)
    sources = method.sources(config).possible()
    while True:
        settled = [why for entry in unread_fields(config, method, sources) if (why := _ignored(entry, raw)) is not None]
        if not settled:
            return config, ignored
        ignored += settled
        config = dataclasses.replace(config, **{why.name: default_of(config, method, why.name) for why in settled})
        sources = method.sources(config).possible()


def _displaced_location(config: DistillConfig, raw: DistillConfig) -> tuple[DistillConfig, list[Ignored]]:
    """A run has one teacher location: when the user names one (`--teacher_url` on a recipe with `teacher_cache`), the
    field a base layer set to name another is ignored (back at None)."""
    origins: Origins = raw.origins
    selecting = [location.selected_by[0] for location in locations() if location.selected_by]
    chosen = [(name, layer) for name in selecting if getattr(raw, name) is not None
              and ((layer := origins.layer_of(name, getattr(raw, name))) is None or layer.users)]
    if not chosen:
        return config, []
    name, layer = chosen[0]
    cause = layer.quote(name) if layer is not None else f"{name}: {written(getattr(raw, name))}"
    displaced = [Ignored(other, base, cause) for other in selecting if other not in dict(chosen)
                 and getattr(raw, other) is not None and (base := origins.set_by_base(other, getattr(raw, other))) is not None]
    cleared: dict[str, Any] = {field.name: None for field in displaced}
    return dataclasses.replace(config, **cleared), displaced


def default_of(config: DistillConfig, method: Method, name: str):
    """The value field `name` has when nothing sets it: the method's default, else the field's."""
    if name in method.defaults:
        return method.defaults[name]
    return field_default(next(f for f in dataclasses.fields(config) if f.name == name))


def _ignored(entry: Unread, raw: DistillConfig) -> Ignored | None:
    """`entry` as an ignored field when a base layer set it and one of the user's fields makes it inert, else None."""
    origins: Origins = raw.origins
    layer = origins.set_by_base(entry.name, getattr(raw, entry.name))
    if layer is None:
        return None
    cause = _cause(entry.name, raw, origins)
    return Ignored(entry.name, layer, cause) if cause is not None else None


def _cause(name: str, raw: DistillConfig, origins: Origins) -> str | None:
    """How the user wrote the first of their fields that, given the value it has without them, makes field `name` read
    again; None when none does."""
    defaults = {f.name: field_default(f) for f in dataclasses.fields(raw)}
    for field_name, value in dataclasses.asdict(raw).items():
        layer = origins.layer_of(field_name, value)
        if layer is not None and not layer.users:
            continue
        without = origins.base_value(field_name, defaults[field_name])
        if without != value and name in _read_names(dataclasses.replace(raw, **{field_name: without})):
            # No layer holds the value: the user's code set it on the config afterwards.
            return layer.quote(field_name) if layer is not None else f"{field_name}: {written(value)}"
    return None


def _read_names(config: DistillConfig) -> set[str]:
    """The fields an active part of a run of `config` reads (none when the config is not one a run could have)."""
    try:
        method = get_method(config.method)
        config = with_method_defaults(config, method)
        active, _ = read_by(config, method, method.sources(config).possible())
    except ValueError:
        return set()
    return active
