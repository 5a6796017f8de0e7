"""The conversations feature: tools and environments in the student's rollouts (`ConversationFields`), what it reads
and its rules (moved here from the config's checks: a config is checked against every registered feature)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.conversations.environments import EnvironmentFactory
from distill.conversations.fields import ConversationFields
from distill.conversations.tools import load_tools
from distill.features import Feature
from distill.registry import Reads

if TYPE_CHECKING:
    from distill.config import DistillConfig


def _talks(config: DistillConfig) -> bool:
    own = ConversationFields.of(config)
    return bool(own.tools) or own.environment is not None


class Conversations(Feature):
    """Every run reads `tools` and `environment`; the tool-call loop's bounds are read when either is set."""

    name = "conversations"
    fields = (ConversationFields,)

    def reads(self, sources: frozenset[str]) -> tuple[Reads, ...]:
        return (Reads("every run", ("tools", "environment")),
                Reads("tools or an environment (the tool-call loop)", ("max_turns", "tool_timeout", "fail_on_token_drift"),
                      _talks))

    def check_settings(self, config: DistillConfig) -> None:
        """Every tool's import path resolves and no two tools share a name; the environment's factory loads; the
        loop's bounds are positive."""
        own = ConversationFields.of(config)
        if own.tools or own.environment is not None:
            tools = load_tools(list(own.tools))  # every import path resolves, no two tools share a name
            if own.environment is not None:
                EnvironmentFactory.load(own.environment, set(tools))
            if own.max_turns < 1 or not own.tool_timeout > 0:
                raise ValueError(f"max_turns must be >= 1 and tool_timeout > 0, got {own.max_turns!r} and "
                                 f"{own.tool_timeout!r}")
