"""Template probes: what a chat template does, found by rendering small stand-in conversations (the doctor's checks
read them; a renderer probes tool support itself, `distill.rendering.conversation.renders_tool_calls`)."""

from __future__ import annotations

from distill.rendering.conversation import ConversationRenderer, renders_tool_calls

__all__ = ["PREFIX_PROBE", "generation_prompt", "prefix_problem", "renders_tool_calls"]

# Two turns, the first with a `<think>` block: a template that strips it once a later user turn follows (Qwen3's)
# does not preserve prefixes.
PREFIX_PROBE = [{"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "<think>\nadding\n</think>\n\n4"},
                {"role": "user", "content": "And 3 + 3?"},
                {"role": "assistant", "content": "6"}]


def prefix_problem(tokenizer, eos_ids: list[int]) -> str | None:
    """Why the tokenizer's chat template cannot render a multi-turn row turn by turn (it re-renders earlier turns
    once later ones follow), or None. The tokenizer has a chat template."""
    try:
        ConversationRenderer(tokenizer, eos_ids).render(PREFIX_PROBE, None, "a two-turn probe")
    except ValueError as error:
        return str(error)
    return None


def generation_prompt(tokenizer) -> str | None:
    """The text the chat template adds to open the assistant's answer (the generation prompt), or None without a
    chat template."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    probe = [{"role": "user", "content": "question"}]
    with_prompt = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    without = tokenizer.apply_chat_template(probe, tokenize=False)
    return with_prompt[len(without):] if with_prompt.startswith(without) else with_prompt
