"""The table of generation engines: `generation_engine`'s values, in order of preference under `auto`.

A leaf: it imports no engine's code (the built-in engines are declared by `distill.parts`, by name, settings and
import path, and imported when first asked for) and refers to the interface (`distill.generation.engine.Engine`)
and its check by import path, so the config composes the engines' settings without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.config.values import AUTO_ENGINE
from distill.registry import Registry, load_built_in_parts

if TYPE_CHECKING:  # annotations only: this module stays a leaf
    from distill.config import DistillConfig
    from distill.generation.engine import Engine

AUTO = AUTO_ENGINE  # `generation_engine: auto`

ENGINES: Registry[Engine] = Registry("generation_engine", "generation engine", also=(AUTO,), load=load_built_in_parts,
                                     order=lambda name, engine: (engine.auto_order is None, engine.auto_order or 0, name),
                                     interface="distill.generation.engine:Engine",
                                     check="distill.generation.engine:check_engine")


def engine_names() -> tuple[str, ...]:
    """The registered engines' names, those taking part in `auto` first, in order of preference (ordering them imports
    their code)."""
    return ENGINES.names()


def get_engine(name: str) -> Engine:
    """The engine `name`; an unknown name is a ValueError listing the others."""
    return ENGINES.get(name)


def register_engine(engine: Engine | type[Engine]) -> Engine:
    """Add an engine (an instance, or its class: an abstract member left out is refused, named)."""
    return ENGINES.register(engine)


def unregister_engine(name: str) -> None:
    """Remove an engine and its own settings (tests that register a toy clean up with this)."""
    ENGINES.unregister(name)


def configure_engine(config: DistillConfig) -> None:
    """Give the engine a run names its settings (`configure(config)`, optional), before anything is decoded."""
    if config.generation_engine != AUTO:
        get_engine(config.generation_engine).configure(config)


def close_engine(name: str) -> None:
    """Release what the engine `name` holds for the run (`close()`, optional: vLLM's replicas)."""
    if name != AUTO:
        get_engine(name).close()
