"""Conversations rendered for training: every assistant turn trained through its end of turn, the rest attended only,
token-in/token-out (turn by turn, as the template's differences), with ChatML and the real Qwen2.5, Qwen3 and Llama 3
templates (`templates.py`); what only the thinking templates do is `test_real_templates.py`."""

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


def shown_text(tokenizer, eos, messages, tools, **kwargs) -> str:
    """What the template renders for `messages` (with distill's tool format where it has none)."""
    shown, extra = ConversationRenderer(tokenizer, eos, kwargs).template_messages(messages, tools, "row 0")
    return tokenizer.apply_chat_template(shown, tokenize=False, **extra, **kwargs)


def test_which_templates_render_tool_calls(family):
    name, tokenizer, _ = family
    assert renders_tool_calls(tokenizer) is name.startswith("qwen")


def test_every_assistant_turn_is_trained_through_its_end_of_turn_and_nothing_else(family):
    """With each family's real template (parallel calls included): four turns trained, each ending at its end of turn;
    the tool and user turns attended only; a template that preserves prefixes gives one sequence whose ids decode to
    exactly what it renders for the whole conversation; Qwen3's, which re-renders its history, a piece per turn."""
    name, tokenizer, eos = family
    rendered = ConversationRenderer(tokenizer, eos).render(CONVERSATION, TOOLS, "row 0")
    assert rendered.assistant_turns == 4 and len(rendered.pieces) == (4 if name == "qwen3" else 1)
    runs = [run for piece in rendered.pieces for run in trained_text(tokenizer, piece.completion_ids, piece.trained)]
    end = tokenizer.decode(eos)
    assert len(runs) == 4 and all(run.endswith(end) for run in runs)
    assert runs[1].strip().endswith(f"It is 391.{end}") and runs[3].strip().endswith(f"400.{end}")
    assert '"expr": "17*23"' in runs[0] and runs[2].count("<tool_call>") == 2 and "Let me check." in runs[2]
    for piece in rendered.pieces:
        assert len(piece.completion_ids) == len(piece.trained) == piece.layout.length
        untrained = tokenizer.decode([t for t, f in zip(piece.completion_ids, piece.trained) if not f])
        assert not any(text in run for run in runs for text in ("391<", "And plus 9?"))
        assert all(m["role"] != "assistant" for s in piece.layout.segments for m in s.messages)
        if piece.completion_ids and piece is rendered.pieces[0] and name != "qwen3":
            assert "391" in untrained and "And plus 9?" in untrained  # tool and user turns: attended, not trained
    first = tokenizer.decode(rendered.pieces[0].prompt_ids)
    assert "You are careful." in first and "17 * 23" in first
    if name != "qwen3":  # token-in/token-out: the pieces decode to exactly what the template renders
        piece = rendered.pieces[0]
        assert tokenizer.decode(piece.prompt_ids + piece.completion_ids) == shown_text(tokenizer, eos, CONVERSATION, TOOLS)
    else:  # each piece: the context the template renders before its turn, then that turn as the last message
        turns = [i for i, m in enumerate(CONVERSATION) if m["role"] == "assistant"]
        for piece, i in zip(rendered.pieces, turns):
            context = shown_text(tokenizer, eos, CONVERSATION[:i], TOOLS, add_generation_prompt=True)
            assert tokenizer.decode(piece.prompt_ids) == context
            assert piece.layout.history == tuple(CONVERSATION[2:i])  # what a teacher with its own template renders
            assert context + tokenizer.decode(piece.completion_ids) == shown_text(tokenizer, eos, CONVERSATION[: i + 1], TOOLS)


def test_the_newline_chatml_puts_after_the_end_of_turn_is_not_trained():
    from tests.conversations.conftest import family_tokenizer

    tokenizer, eos = family_tokenizer("chatml")
    (piece,) = ConversationRenderer(tokenizer, eos).render(CONVERSATION[:5], TOOLS, "row 0").pieces
    ends = [k for k, token in enumerate(piece.completion_ids) if token == eos[0]]
    for k in ends:  # each <|im_end|>: an assistant's is trained, a tool's is not; the newline after it never
        assert tokenizer.decode([piece.completion_ids[k + 1]]).startswith("\n")
        assert piece.trained[k + 1] is False
    assert [piece.trained[k] for k in ends] == [True, False, True]


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
    assert rendered.assistant_turns == turns
    runs = []
    for piece in rendered.pieces:
        assert len(piece.completion_ids) == len(piece.trained) == piece.layout.length
        runs += trained_text(tokenizer, piece.completion_ids, piece.trained)
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
