"""Chat templates of three families, written here for the tests (no hub): the shapes that break multi-turn training.

- CHATML: the default model's plain ChatML (role and content only, a newline after each `<|im_end|>`), as the
  tiny tokenizer carries it (`tests.conftest.CHAT_TEMPLATE`).
- QWEN3_STYLE: ChatML with tool support (`tools` in the system message, `tool_calls` as <tool_call> blocks, tool
  results as user turns holding <tool_response>) that drops the `<think>` block of assistant turns before the last
  user turn, as Qwen3's does: not prefix-preserving once a user turn follows a reasoning turn.
- LLAMA3_STYLE: Llama 3's headers, content trimmed, `<|eot_id|>` ending each turn with no newline after it, and no
  tool support (it renders a tool turn as a role like any other and ignores `tool_calls`).
"""

from tests.conftest import CHAT_TEMPLATE

CHATML = CHAT_TEMPLATE

QWEN3_STYLE = (
    "{% set last_user = namespace(i=-1) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set last_user.i = loop.index0 %}{% endif %}{% endfor %}"
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% if not tools %}<|im_start|>system\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% elif m['role'] == 'assistant' %}"
    "{% set content = m['content'] or '' %}"
    "{% if loop.index0 < last_user.i and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "<|im_start|>assistant\n{{ content }}"
    "{% for c in m.get('tool_calls', []) %}"
    "{% if content or not loop.first %}\n{% endif %}"
    "<tool_call>\n{\"name\": \"{{ c['function']['name'] }}\", \"arguments\": {{ c['function']['arguments'] | tojson }}}\n"
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ (m['content'] or '') | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
