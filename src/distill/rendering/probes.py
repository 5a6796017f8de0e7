"""Template probes: what a chat template does, found by rendering small stand-in conversations (the doctor's checks
read them; a renderer probes tool support itself, `distill.rendering.conversation.renders_tool_calls`). Each takes
the run's template arguments (`template_kwargs`), as every rendering does."""

from __future__ import annotations

from typing import Any, Mapping

from distill.rendering.conversation import ConversationRenderer, first_difference, renders_tool_calls

__all__ = ["PREFIX_PROBE", "generation_prompt", "prefix_problem", "renders_tool_calls"]

# Two turns, the first with a `<think>` block: a template that strips it once a later user turn follows (Qwen3's)
# does not preserve prefixes. Without thinking (a template argument that turns it off refuses the block), the same
# two turns without it.
PREFIX_PROBE = [{"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "<think>\nadding\n</think>\n\n4"},
                {"role": "user", "content": "And 3 + 3?"},
                {"role": "assistant", "content": "6"}]
PLAIN_PROBE = [*PREFIX_PROBE[:1], {"role": "assistant", "content": "4"}, *PREFIX_PROBE[2:]]


def prefix_problem(tokenizer, eos_ids: list[int], template_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """How the tokenizer's chat template re-renders an earlier turn once later ones follow (so a multi-turn row is
    trained in pieces, `distill.rendering.conversation`), or None when it preserves prefixes. The tokenizer has a
    chat template."""
    renderer = ConversationRenderer(tokenizer, eos_ids, template_kwargs)
    for probe in (PREFIX_PROBE, PLAIN_PROBE):
        try:
            pieces = renderer.render(probe, None, "a two-turn probe").pieces
        except ValueError:  # a turn its generation prompt cannot open (a <think> block with thinking off)
            continue
        if len(pieces) == 1:
            return None
        before = renderer.text(probe[:2], {}, generation_prompt=False)
        after = renderer.text(probe[:3], {}, generation_prompt=True)
        return (f"the chat template renders an earlier turn differently once a later turn follows "
                f"({first_difference(before, after)})")
    return None


def generation_prompt(tokenizer, template_kwargs: Mapping[str, Any] | None = None) -> str | None:
    """The text the chat template adds to open the assistant's answer (the generation prompt), or None without a
    chat template."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    probe = [{"role": "user", "content": "question"}]
    kwargs = dict(template_kwargs or {})
    with_prompt = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **kwargs)
    without = tokenizer.apply_chat_template(probe, tokenize=False, **kwargs)
    return with_prompt[len(without):] if with_prompt.startswith(without) else with_prompt
