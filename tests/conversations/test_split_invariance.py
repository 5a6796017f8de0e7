"""Split invariance with conversations: rows of different lengths and turn counts give the same first-step gradient on
one process with one micro-batch as on two processes with two micro-batches each (gloo, CPU)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import train_tiny_tokenizer
from tests.conversations.test_render import TOOLS, call
from tests.distributed import check_split_invariance, first_step_gradient
from tests.helpers.training import make_distiller


def conversation_rows() -> list[dict]:
    """8 rows: plain answers and conversations of 1 to 3 tool calls, answers of unequal lengths."""
    rows = []
    for i in range(8):
        messages = [{"role": "user", "content": f"Question {i}?"}]
        for k in range(i % 4):
            messages += [{"role": "assistant", "content": "", "tool_calls": [call("calc", expr=f"{i}+{k}")]},
                         {"role": "tool", "content": str(i + k)}]
        messages.append({"role": "assistant", "content": " ".join(["word"] * (1 + 2 * i))})
        rows.append({"messages": messages, "tools": TOOLS} if i % 4 else {"messages": messages})
    return rows


def _step_gradient(rank, world_size, tmp, batch, accumulation):
    torch.manual_seed(0)
    tokenizer = train_tiny_tokenizer()
    distiller = make_distiller(tokenizer, Path(tmp) / f"rank{rank}", rows=conversation_rows(), lmbda=0.0, max_grad_norm=0.0,
                               per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                               max_new_tokens=300, max_prompt_length=200)
    return first_step_gradient(distiller)


def test_the_gradient_over_conversations_is_split_invariant(tmp_path):
    check_split_invariance(_step_gradient, tmp_path, ("loss", "forward_kl", "reverse_kl", "completion_length"))
