"""Reading a sampled turn's calls in the format its chat template writes them: the Hermes blocks, or Llama 3's one
JSON object per turn; each real template's format found by rendering a probe call, and a template whose calls distill
cannot read refused before any rollout."""

from __future__ import annotations

import pytest

from distill.agents.setup import offering_tools, tool_loop
from distill.config import DistillConfig
from distill.conversations.tool_calls import HERMES, JSON_OBJECT, ToolCall, parse_json_call, render_tool_calls
from distill.rendering import ConversationRenderer, EnvironmentTurns, TextRenderer
from tests.conftest import train_tiny_tokenizer
from tests.conversations.conftest import family_tokenizer


def test_a_json_object_turn_is_one_call_and_anything_else_an_answer():
    assert parse_json_call('{"name": "add", "parameters": {"a": 2, "b": 3}}').calls == [ToolCall("add", {"a": 2, "b": 3})]
    assert parse_json_call(' \n{"name": "add", "arguments": {"a": 1}}\n').calls == [ToolCall("add", {"a": 1})]
    assert parse_json_call('{"name": "now"}').calls == [ToolCall("now", {})]
    answer = parse_json_call("It is 5. {not a call}")
    assert answer.calls == [] and answer.malformed == [] and answer.content == "It is 5. {not a call}"
    assert parse_json_call('{"name": "add", "parameters": {"a": 2').malformed[0].startswith("the tool call is not JSON")
    for wrong in ('{"parameters": {}}', '{"name": "", "parameters": {}}', '{"name": "add", "parameters": [1]}', "[1]"):
        turn = parse_json_call(wrong if wrong != "[1]" else "{" + wrong[1:-1] + "}")
        assert turn.calls == [] and len(turn.malformed) == 1, wrong


@pytest.mark.parametrize("family, expected", [("chatml", HERMES), ("llama3", HERMES), ("qwen2_5", HERMES),
                                              ("qwen3", HERMES), ("llama3_1", JSON_OBJECT), ("llama3_2", JSON_OBJECT)])
def test_each_real_template_writes_calls_in_a_format_its_parser_reads_back(family, expected):
    """ChatML and Llama 3 have no tool support (distill writes Hermes blocks into the text); Qwen's templates write
    Hermes blocks themselves; Llama 3.1's and 3.2's write the turn as one JSON object."""
    tokenizer, eos = family_tokenizer(family)
    found, written = ConversationRenderer(tokenizer, eos, {"date_string": "01 Jan 2025"}).call_format()
    assert found is expected, written
    assert EnvironmentTurns(tokenizer, ConversationRenderer(tokenizer, eos), eos).call_format is expected


def test_a_template_whose_calls_distill_cannot_read_is_refused_naming_what_it_writes():
    tokenizer = train_tiny_tokenizer()
    tokenizer.chat_template = (  # calls as Mistral's templates write them: no real one ships with the test dependencies
        "{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list "
        "| tojson }}{{ eos_token }}{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]{% else %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    eos = [tokenizer.eos_token_id]
    found, written = ConversationRenderer(tokenizer, eos).call_format()
    assert found is None and written.startswith("[TOOL_CALLS]")
    with pytest.raises(ValueError, match=r"writes a tool call as '\[TOOL_CALLS\].*cannot read back.*Hermes: <tool_call>"):
        _ = EnvironmentTurns(tokenizer, ConversationRenderer(tokenizer, eos), eos).call_format
    config = DistillConfig(tools=["tests.conversations.toolbox:add"])  # a run's loop is refused as it is built
    with pytest.raises(ValueError, match="cannot read back from a sampled turn"):
        tool_loop(config, offering_tools(config, TextRenderer(tokenizer, 256, 64, eos)), 64)


def test_hermes_blocks_are_no_call_in_a_json_object_template_and_back():
    hermes = render_tool_calls([ToolCall("add", {"a": 1})])
    assert parse_json_call(hermes).calls == [] and HERMES.parse('{"name": "add", "parameters": {}}').calls == []
