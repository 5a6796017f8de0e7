"""distill's lean decode loop as an engine (`distill.generation.lean_decode`): Llama-family float32 models on CPU, the
same distribution as `generate` in less time; it refuses every other model (`refusal` says why). Given a rollout's
`ConversationCache` it keeps each conversation's keys and values between turns (`distill.generation.lean_turns`)."""

from __future__ import annotations

import torch

from distill.generation.engine import DecodeRequest, Engine
from distill.generation.lean_decode import lean_generate, refusal
from distill.generation.lean_turns import TurnCache


class LeanDecode(Engine):
    name = "lean"
    label = "distill's lean loop"
    auto_order = 0

    def refusal(self, model, device: torch.device) -> str | None:
        return refusal(model, device)

    def decode(self, model, request: DecodeRequest) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Without `seeded_rows` this engine samples on torch's process RNG, which the run seeds and checkpoints (engine.py).
        sampling = request.sampling
        conversations = None
        if request.conversations is not None:  # keep each conversation's keys and values between its turns
            state = request.conversations.state
            if not isinstance(state, TurnCache) or not state.serves(model):
                state = request.conversations.state = TurnCache(model)
            conversations = state
        return lean_generate(model, request.input_ids, request.attention_mask, max_new_tokens=sampling.max_new_tokens,
                             do_sample=sampling.do_sample, temperature=sampling.temperature, top_k=sampling.top_k,
                             top_p=sampling.top_p, eos_ids=request.stop_ids, pad_id=request.pad_id,
                             suppress_tokens=request.suppress_ids, stopping_criteria=request.stopping_criteria,
                             with_log_probs=request.with_log_probs, generators=request.row_generators(),
                             conversations=conversations, keys=request.conversation_keys)
