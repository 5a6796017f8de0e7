"""Tokenizers with the three families' templates (`templates.py`) over the tiny tokenizer."""

from __future__ import annotations

import pytest

from tests.conftest import train_tiny_tokenizer
from tests.conversations.templates import CHATML, LLAMA3_STYLE, QWEN3_STYLE

LLAMA3_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def family_tokenizer(family: str):
    """(tokenizer, end-of-turn ids) for "chatml", "qwen3" or "llama3"."""
    tokenizer = train_tiny_tokenizer()
    if family == "llama3":
        tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS})
    tokenizer.chat_template = {"chatml": CHATML, "qwen3": QWEN3_STYLE, "llama3": LLAMA3_STYLE}[family]
    end = tokenizer.convert_tokens_to_ids("<|eot_id|>") if family == "llama3" else tokenizer.eos_token_id
    return tokenizer, [end]


@pytest.fixture(scope="session", params=["chatml", "qwen3", "llama3"])
def family(request):
    return (request.param, *family_tokenizer(request.param))
