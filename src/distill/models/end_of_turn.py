"""The tokens that end a completion: the chat template's end of turn, the tokenizer's EOS, the generation
config's; found by rendering a probe turn."""

from __future__ import annotations

import logging

from torch import nn

logger = logging.getLogger(__name__)


TURN_PROBE = "distill-end-of-turn-probe"


def end_of_turn_id(tokenizer) -> int | None:
    """The token the chat template closes an assistant turn with, or None (no chat template, or nothing
    special follows the turn's text).

    Found by rendering a conversation whose last assistant turn is a probe text and taking the first special
    (or added) token after it: `<|im_end|>` for ChatML (SmolLM2, Qwen), `<|eot_id|>` for Llama-3,
    `<end_of_turn>` for Gemma, `</s>` for Mistral. Chat models whose turns end with another token than the
    tokenizer's EOS would otherwise be trained to never stop (or to stop at a token their template never writes).
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    conversation = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": TURN_PROBE}]
    from jinja2 import TemplateError

    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except (TemplateError, ValueError, TypeError, KeyError, IndexError):  # a template refusing this conversation
        return None
    if not isinstance(text, str) or TURN_PROBE not in text:
        return None
    after = text[text.rindex(TURN_PROBE) + len(TURN_PROBE):]
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    for token in tokenizer(after, add_special_tokens=False)["input_ids"] if after else []:
        if token in special:
            return int(token)
    return None


def eos_token_ids(tokenizer, model: nn.Module) -> list[int]:
    """The tokens that end a completion, deduplicated, the one appended to dataset and teacher completions
    first: the chat template's end of turn (`end_of_turn_id`), the tokenizer's EOS, the generation config's
    (int or list). Generation stops at any of them."""
    ids: list[int] = []
    candidates = [end_of_turn_id(tokenizer), tokenizer.eos_token_id]
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    candidates += generation_eos if isinstance(generation_eos, (list, tuple)) else [generation_eos]
    for token in candidates:
        if token is not None and int(token) not in ids:
            ids.append(int(token))
    return ids


def describe_stop_tokens(tokenizer, ids: list[int]) -> str:
    """'<|im_end|>' (id 2), or with more stop tokens: '<|im_end|>' (id 2); stops at any of '<|im_end|>' (2), ..."""
    if not ids:
        return "none (completions run to max_new_tokens)"
    names = [f"{tokenizer.convert_ids_to_tokens(i)!r} ({i})" for i in ids]
    first = f"{tokenizer.convert_ids_to_tokens(ids[0])!r} (id {ids[0]})"
    return first if len(ids) == 1 else f"{first}; generation stops at any of {', '.join(names)}"


