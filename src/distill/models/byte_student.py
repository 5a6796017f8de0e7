"""A student built from scratch on a byte vocabulary: `student: byte-llama` (or `byte-llama:LAYERSxHIDDEN`).

Its tokenizer has 258 tokens, the 256 bytes (GPT-2 byte-level characters, no merges) and the ChatML
markers <|im_start|> and <|im_end|> (EOS = pad), so it shares no tokenization with a BPE teacher: every
teacher token spans several student tokens. It needs no download, which makes it the CPU recipe's student
for cross-tokenizer distillation (method gold). The model is a small Llama, initialised with a fixed seed.
"""

from __future__ import annotations

import re

import torch

PREFIX = "byte-llama"
DEFAULT_SHAPE = (4, 256)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def is_byte_student(spec: str) -> bool:
    return spec == PREFIX or spec.startswith(PREFIX + ":")


def parse_shape(spec: str) -> tuple[int, int]:
    """(layers, hidden) of 'byte-llama' or 'byte-llama:4x256'; raises ValueError with the accepted form."""
    if spec == PREFIX:
        return DEFAULT_SHAPE
    match = re.fullmatch(PREFIX + r":(\d+)x(\d+)", spec)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 16 or int(match.group(2)) % 16:
        raise ValueError(f"student: {spec!r} must be '{PREFIX}' or '{PREFIX}:LAYERSxHIDDEN' (hidden a multiple of 16), "
                         f"e.g. '{PREFIX}:4x256'")
    return int(match.group(1)), int(match.group(2))


def byte_tokenizer():
    """The 258-token byte tokenizer (a fast tokenizer with a ChatML template), built without training."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from distill.align import byte_level_alphabet

    alphabet = sorted(byte_level_alphabet().items(), key=lambda item: item[1])
    vocab = {char: byte for char, byte in alphabet}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<|im_end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def byte_llama(spec: str, tokenizer) -> torch.nn.Module:
    """A randomly initialised Llama over the byte vocabulary (seeded, without touching the global RNG)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden = parse_shape(spec)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                         num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 64, 1),
                         max_position_embeddings=2048, tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForCausalLM(config)
