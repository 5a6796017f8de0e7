"""The run's tools, environment and tool-call loop, built from its config: one path for training and `distill eval`."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from distill.agents.loop import LoopSettings, ToolLoop
from distill.conversations.calls import ToolCalls
from distill.conversations.environments import EnvironmentFactory
from distill.conversations.fields import ConversationFields
from distill.conversations.tools import load_tools

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.rendering import Renderer

logger = logging.getLogger(__name__)


def offering_tools(config: DistillConfig, renderer: Renderer) -> Renderer:
    """`renderer`, showing the run's tools (and its environment's) in every prompt; itself without any."""
    own = ConversationFields.of(config)
    if not own.tools and own.environment is None:
        return renderer
    return renderer.offering(offered_schemas(config))


def offered_schemas(config: DistillConfig) -> list[dict]:
    """The JSON schemas every prompt shows: the run's `tools`, then its environment's methods."""
    own = ConversationFields.of(config)
    tools = load_tools(list(own.tools))
    factory = EnvironmentFactory.load(own.environment, set(tools)) if own.environment is not None else None
    return [tool.schema for tool in tools.values()] + (list(factory.schemas) if factory is not None else [])


def tool_loop(config: DistillConfig, renderer: Renderer, budget: int, record_log_probs: bool = False) -> ToolLoop | None:
    """The run's tool-call loop (None without tools or an environment): its tools and environment, the template's tool
    turns, `max_turns` and `budget` completion tokens per conversation (max_new_tokens; the evaluation's own)."""
    own = ConversationFields.of(config)
    if not own.tools and own.environment is None:
        return None
    tokenizer = renderer.tokenizer
    tools = load_tools(list(own.tools))
    factory = EnvironmentFactory.load(own.environment, set(tools)) if own.environment is not None else None
    environment = renderer.environment_turns()
    logger.info("tool calls are read in the %s format (%s), as the chat template writes them",
                environment.call_format.name, environment.call_format.example)  # a format distill cannot read stops here
    if environment.problem is not None:  # probed before any rollout: which way the loop goes on after a turn
        logger.info("%s: the tool-call loop re-renders each turn's context, and a conversation whose context no longer "
                    "extends its ids goes on in a new piece (docs/usage.md, chat templates)", environment.problem)
    memory_limit = int(own.tool_memory_gb * 2**30) if own.tool_memory_gb > 0 else None
    calls = ToolCalls(tools, factory, own.tool_timeout, own.tool_workers, memory_limit)  # no worker starts yet
    return ToolLoop(calls, environment, lambda ids: tokenizer.decode(ids),
                    LoopSettings(own.max_turns, budget, record_log_probs, own.fail_on_token_drift), renderer)
