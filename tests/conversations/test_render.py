"""Conversations rendered for training: every assistant turn trained through its end of turn, the rest attended only,
token-in/token-out (turn by turn, as the template's differences), with ChatML, a Qwen3-style and a Llama-3-style
template."""

from __future__ import annotations

import random

import pytest

from distill.conversations.tool_calls import ToolCall, parse_tool_calls, render_tool_calls
from distill.rendering import ConversationRenderer, renders_tool_calls

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "arithmetic",
                                           "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]


def call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION = [
    {"role": "system", "content": "You are careful."},
    {"role": "user", "content": "What is 17 * 23?"},
    {"role": "assistant", "content": "", "tool_calls": [call("calc", expr="17*23")]},
    {"role": "tool", "name": "calc", "content": "391"},
    {"role": "assistant", "content": "It is 391."},
    {"role": "user", "content": "And plus 9?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [call("calc", expr="391+9"), call("calc", expr="9+391")]},
    {"role": "tool", "name": "calc", "content": "400"},
    {"role": "tool", "name": "calc", "content": "400"},
    {"role": "assistant", "content": "400."},
]


def trained_text(tokenizer, ids, trained) -> list[str]:
    """The trained runs of tokens, decoded, in order."""
    runs, current = [], []
    for token, flag in zip(ids, trained):
        if flag:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    return runs + ([tokenizer.decode(current)] if current else [])


def test_which_templates_render_tool_calls(family):
    name, tokenizer, _ = family
    assert renders_tool_calls(tokenizer) is (name == "qwen3")


def test_every_assistant_turn_is_trained_through_its_end_of_turn_and_nothing_else(family):
    name, tokenizer, eos = family
    rendered = ConversationRenderer(tokenizer, eos).render(CONVERSATION, TOOLS, "row 0")
    assert len(rendered.completion_ids) == len(rendered.trained) and rendered.assistant_turns == 4
    runs = trained_text(tokenizer, rendered.completion_ids, rendered.trained)
    end = tokenizer.decode(eos)
    assert len(runs) == 4 and all(run.endswith(end) for run in runs)
    assert runs[1].strip() == f"It is 391.{end}" and runs[3].strip() == f"400.{end}"
    assert '"expr": "17*23"' in runs[0] and runs[2].count("<tool_call>") == 2 and runs[2].startswith("Let me check.")
    untrained = tokenizer.decode([t for t, f in zip(rendered.completion_ids, rendered.trained) if not f])
    assert "391" in untrained and "And plus 9?" in untrained  # tool and user turns: attended, not trained
    assert "You are careful." in tokenizer.decode(rendered.prompt_ids) and "17 * 23" in tokenizer.decode(rendered.prompt_ids)
    # Token-in/token-out: the pieces decode to exactly what the template renders for the whole conversation.
    shown, extra = ConversationRenderer(tokenizer, eos).template_messages(CONVERSATION, TOOLS, "row 0")
    whole = tokenizer.apply_chat_template(shown, tokenize=False, **extra)
    assert tokenizer.decode(rendered.prompt_ids + rendered.completion_ids) == whole


def test_the_newline_chatml_puts_after_the_end_of_turn_is_not_trained():
    from tests.conversations.conftest import family_tokenizer

    tokenizer, eos = family_tokenizer("chatml")
    rendered = ConversationRenderer(tokenizer, eos).render(CONVERSATION[:5], TOOLS, "row 0")
    ends = [k for k, token in enumerate(rendered.completion_ids) if token == eos[0]]
    for k in ends:  # each <|im_end|>: an assistant's is trained, a tool's is not; the newline after it never
        assert tokenizer.decode([rendered.completion_ids[k + 1]]).startswith("\n")
        assert rendered.trained[k + 1] is False
    assert [rendered.trained[k] for k in ends] == [True, False, True]


def test_a_template_that_drops_earlier_reasoning_is_refused_for_that_row():
    from tests.conversations.conftest import family_tokenizer

    tokenizer, eos = family_tokenizer("qwen3")
    renderer = ConversationRenderer(tokenizer, eos)
    thinking = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4."}]
    assert renderer.render(thinking, None, "row 3").assistant_turns == 1  # no later user turn: nothing is dropped
    with_tool = thinking[:1] + [{"role": "assistant", "content": "<think>\nuse it\n</think>\n\n", "tool_calls": [call("calc")]},
                                {"role": "tool", "content": "4"}, {"role": "assistant", "content": "<think>\nok\n</think>\n\n4."}]
    assert renderer.render(with_tool, TOOLS, "row 3").assistant_turns == 2  # tool turns are not user turns here
    later_user = thinking + [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6."}]
    with pytest.raises(ValueError, match=r"row 3: .*drops the `<think>` block .* preserves prefixes"):
        renderer.render(later_user, None, "row 3")


@pytest.mark.parametrize("seed", range(20))
def test_random_conversations_keep_ids_and_masks_aligned(family, seed):
    """Property: over random conversations, ids and mask have equal lengths; every trained run is one assistant turn
    ending at its end of turn; no tool result or user text is ever trained."""
    _, tokenizer, eos = family
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "42", "x=3", "café", "東京"]
    messages, turns = [{"role": "user", "content": " ".join(rng.choices(words, k=3))}], 0
    for _ in range(rng.randint(1, 4)):
        calls = [call("calc", expr=rng.choice(words)) for _ in range(rng.randint(0, 2))]
        messages.append({"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(0, 4))),
                         **({"tool_calls": calls} if calls else {})})
        turns += 1
        messages += [{"role": "tool", "content": f"result-{rng.randint(0, 99)}"} for _ in calls]
        if not calls and rng.random() < 0.5:
            messages.append({"role": "user", "content": "more " + rng.choice(words)})
    rendered = ConversationRenderer(tokenizer, eos).render(messages, TOOLS, f"row {seed}")
    assert len(rendered.completion_ids) == len(rendered.trained) and rendered.assistant_turns == turns
    runs = trained_text(tokenizer, rendered.completion_ids, rendered.trained)
    assert len(runs) == turns and all(run.endswith(tokenizer.decode(eos)) for run in runs)
    assert not any("result-" in run or "more " in run for run in runs)


def test_the_hermes_format_parses_back_what_it_renders_and_reports_malformed_calls():
    calls = [ToolCall("calc", {"expr": "1+1"}), ToolCall("lookup", {"key": "東京", "n": 2})]
    parsed = parse_tool_calls("Sure.\n" + render_tool_calls(calls))
    assert parsed.content == "Sure." and parsed.calls == calls and parsed.malformed == []
    broken = parse_tool_calls('<tool_call>\n{"name": "calc", "arguments": {"expr": \n</tool_call>'
                              '<tool_call>\n["calc"]\n</tool_call><tool_call>{"name": "ok"}</tool_call>')
    assert broken.calls == [ToolCall("ok", {})] and len(broken.malformed) == 2
    assert "not JSON" in broken.malformed[0] and '"name"' in broken.malformed[1]
