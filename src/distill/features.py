"""Run features: parts of a run any method may use (conversations with tools, asynchronous rollouts, vision-language
students, the doctor's checks). Each declares its settings, the fields it reads and its rules, like a method or a
teacher location does, so that the core (`distill.config.RunFields`) holds only what every run reads.

A feature's settings are a leaf `PartFields` dataclass (`distill.conversations.fields`, ...), composed into
`DistillConfig` when the feature is declared (`distill.parts`); they may set `placed_after` to keep their place in
the flat namespace (config.yaml, `--help`). Its implementation (a `Feature`: reads and rules) is imported when the
config is validated. A leaf: it imports the generic table and `Reads` only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from distill.registry import Reads, Registry, load_built_in_parts

if TYPE_CHECKING:  # annotations only: this module stays a leaf
    from distill.config import DistillConfig
    from distill.methods.base import Method


class Feature(ABC):
    """What a run feature is. Subclasses set `name` and `fields` (its settings classes) and implement `reads`; the
    rules are optional.

    name: the feature's name (messages, the table).
    fields: its own settings (`distill.config.io.PartFields` dataclasses), composed into `DistillConfig`.
    """

    name: str = ""
    fields: tuple[type, ...] = ()

    @abstractmethod
    def reads(self, sources: frozenset[str]) -> tuple[Reads, ...]:
        """The config fields it reads, and when (`sources`: the completion sources the method's plan can draw); the
        no-silent-fields check rejects a field changed while none of its reads is active."""

    def check_settings(self, config: DistillConfig) -> None:
        """Its fields' own rules (ValueError naming the field and the fix), run with the core's field rules, before
        the method's."""

    def check_run(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        """Its rules against the method and the completion sources it draws, run after the method's and the teacher
        location's."""


def _check_feature(feature: Feature) -> None:
    if not feature.name:
        raise TypeError(f"register_feature: {type(feature).__name__} has no name")


FEATURES: Registry[Feature] = Registry("feature", "run feature", load=load_built_in_parts,
                                       interface="distill.features:Feature", check=_check_feature)


def register_feature(feature: Feature | type[Feature]) -> Feature:
    """Add a feature (an instance, or its class: an abstract member left out is refused, named)."""
    return FEATURES.register(feature)


def unregister_feature(name: str) -> None:
    FEATURES.unregister(name)


def features() -> list[Feature]:
    """Every registered feature (their code imported), in registration order."""
    return FEATURES.parts()
