"""The chat templates conversation tests render with: the real ones of three model families, read at test time from
the installed reference library (trl ships them as `.jinja` files in its `chat_templates` folder; they are never
copied into this project), and the project's plain ChatML.

- "chatml": the default model's plain ChatML (role and content only, a newline after each `<|im_end|>`), as the tiny
  tokenizer carries it (`tests.conftest.CHAT_TEMPLATE`). Preserves prefixes; no tool support.
- "qwen2_5": Qwen2.5's: a default system prompt when the conversation has none; tools in the system message; calls
  as `<tool_call>` blocks; consecutive tool results as one user turn of `<tool_response>` blocks (not a prefix of
  itself after each tool message, only after the last). Preserves prefixes at assistant turns.
- "qwen3": Qwen3's: Qwen2.5's tool format without the default system prompt, and thinking: `reasoning_content`
  (or a `<think>` block in the content) rendered as a `<think>` block, only for turns after the last user query
  and, when empty, only on the last turn; `enable_thinking: false` puts an empty block in the generation prompt.
  Does not preserve prefixes.
- "llama3": Llama 3's: headers, content trimmed, `<|eot_id|>` ending each turn; no tool support.
- "llama3_2": Llama 3.2's: a system prompt holding the date (`date_string`, else today's); tools in the first user
  message; one call per assistant turn, written as `{"name": ..., "parameters": ...}`; tool results as `ipython`.
"""

from __future__ import annotations

from importlib.resources import files

from tests.conftest import CHAT_TEMPLATE

CHATML = CHAT_TEMPLATE
REAL = ("qwen2_5", "qwen3", "llama3", "llama3_2")


def real_template(name: str) -> str:
    """The chat template `name` ("qwen2_5", "qwen3", "llama3", "llama3_2", ...) as the installed trl ships it."""
    return (files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def template(family: str) -> str:
    return CHATML if family == "chatml" else real_template(family)
