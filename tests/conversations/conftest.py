"""Tokenizers with the families' chat templates (`templates.py`: the real ones, from the installed trl) over the tiny
tokenizer. The tiny tokenizer has `<|im_start|>` and `<|im_end|>` (ChatML's and Qwen's specials); Llama 3's headers
and end of turn are added to it as special tokens, and Qwen's `<think>`, `<tool_call>` and `<tool_response>` tags as
added (not special) tokens, as the families' own tokenizers have them."""

from __future__ import annotations

import pytest

from tests.conftest import train_tiny_tokenizer
from tests.conversations.templates import template

LLAMA3_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QWEN_TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
FAMILIES = ("chatml", "qwen2_5", "qwen3", "llama3")


def family_tokenizer(family: str):
    """(tokenizer, end-of-turn ids) for "chatml", "qwen2_5", "qwen3", "llama3" or "llama3_2"."""
    tokenizer = train_tiny_tokenizer()
    if family.startswith("llama3"):
        tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    if family.startswith("qwen"):
        tokenizer.add_tokens(QWEN_TAGS)
    tokenizer.chat_template = template(family)
    end = tokenizer.convert_tokens_to_ids("<|eot_id|>") if family.startswith("llama3") else tokenizer.eos_token_id
    return tokenizer, [end]


@pytest.fixture(scope="session", params=FAMILIES)
def family(request):
    return (request.param, *family_tokenizer(request.param))
