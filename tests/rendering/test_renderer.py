"""The renderer interface: every model kind's renderer is a `Renderer`, and a row's own prompt renders the same ids
through each entry point (`row`, `prompt`), with an environment's observation where the tool loop adds one."""

from __future__ import annotations

import pytest

from distill.conversations.layout import with_observation
from distill.data import Example
from distill.models.kinds import model_kind_of
from distill.rendering import Renderer, TextRenderer
from distill.rendering.probes import generation_prompt, prefix_problem

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 2?"}]


def test_a_causal_lm_renders_through_the_text_renderer(tokenizer):
    renderer = model_kind_of(None).encoder(tokenizer, 64, 8, [tokenizer.eos_token_id])
    assert isinstance(renderer, TextRenderer) and isinstance(renderer, Renderer)


@pytest.mark.parametrize("prompt", ["plain text: 2 + 2 =", CHAT])
def test_a_rows_prompt_is_the_same_through_row_and_prompt(tokenizer, prompt):
    renderer = TextRenderer(tokenizer, 64, 8, [tokenizer.eos_token_id])
    example = Example(0, prompt, "4")
    encoded = renderer.row(example)
    assert renderer.prompt(example).ids == encoded.prompt_ids == renderer.prompt_ids(prompt)[0]
    assert encoded.completion_ids == renderer.completion_ids("4") and encoded.completion_ids[-1] == tokenizer.eos_token_id
    observed = renderer.prompt(example, observation=" (observed)")
    assert observed.ids == renderer.prompt_ids(with_observation(prompt, " (observed)"))[0]


def test_another_prompt_of_the_row_shows_the_rows_tools(tokenizer):
    tools = [{"type": "function", "function": {"name": "add", "description": "adds", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
    renderer = TextRenderer(tokenizer, 400, 8, [tokenizer.eos_token_id]).offering(tools)
    example = Example(0, CHAT, None)
    other = [*CHAT[:-1], {"role": "user", "content": "What is 3 + 3?"}]
    assert renderer.prompt(example, other).ids == renderer.prompt_ids(other, tools)[0]
    assert renderer.prompt(example, other).ids != TextRenderer(tokenizer, 400, 8, [tokenizer.eos_token_id]).prompt(example, other).ids
    with pytest.raises(ValueError, match="reads text only"):
        renderer.prompt(example, other, images=(object(),))  # type: ignore[arg-type]


def test_template_probes(tokenizer):
    assert generation_prompt(tokenizer) == "<|im_start|>assistant\n"
    assert prefix_problem(tokenizer, [tokenizer.eos_token_id]) is None
