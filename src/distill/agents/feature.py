"""The conversations feature: tools and environments in the student's rollouts (`ConversationFields`), what it reads
and its rules (moved here from the config's checks: a config is checked against every registered feature)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from distill.conversations.environments import EnvironmentFactory
from distill.conversations.fields import ConversationFields
from distill.conversations.tools import load_tools
from distill.features import Feature
from distill.registry import Reads

if TYPE_CHECKING:
    from distill.config import DistillConfig


MAX_TOOL_TIMEOUT = 86400  # a day: a call is always stopped at some point (and the wait's clock takes no infinity)


def _talks(config: DistillConfig) -> bool:
    own = ConversationFields.of(config)
    return bool(own.tools) or own.environment is not None


class Conversations(Feature):
    """Every run reads `tools` and `environment`; the tool-call loop's bounds are read when either is set."""

    name = "conversations"
    fields = (ConversationFields,)

    def reads(self, sources: frozenset[str]) -> tuple[Reads, ...]:
        return (Reads("every run", ("tools", "environment")),
                Reads("tools or an environment (the tool-call loop)",
                      ("max_turns", "tool_timeout", "tool_workers", "tool_memory_gb", "fail_on_token_drift"), _talks))

    def check_settings(self, config: DistillConfig) -> None:
        """Every tool's import path resolves and no two tools share a name; the environment's factory loads; the
        loop's bounds are positive and finite."""
        own = ConversationFields.of(config)
        if own.tools or own.environment is not None:
            tools = load_tools(list(own.tools))  # every import path resolves, no two tools share a name
            if own.environment is not None:
                EnvironmentFactory.load(own.environment, set(tools))
            if own.max_turns < 1:
                raise ValueError(f"max_turns must be >= 1, got {own.max_turns!r}")
            if not (isinstance(own.tool_timeout, (int, float)) and 0 < own.tool_timeout <= MAX_TOOL_TIMEOUT):
                raise ValueError(f"tool_timeout must be a number of seconds above 0 and at most {MAX_TOOL_TIMEOUT} (a "
                                 f"day), got {own.tool_timeout!r}: a call past it is stopped, so for calls that must not "
                                 "be, give a large value (3600)")
            if own.tool_workers < 1:
                raise ValueError(f"tool_workers must be >= 1, got {own.tool_workers!r}")
            if not (math.isfinite(own.tool_memory_gb) and own.tool_memory_gb >= 0):
                raise ValueError(f"tool_memory_gb must be a finite number >= 0 (0: no limit), got {own.tool_memory_gb!r}")
