"""Completion sources and the rollout of a whole optimizer step.

Every micro-batch of an optimizer step gets one source, drawn before anything is generated:
    "student": the student samples (on-policy)          probability lmbda
    "dataset": the dataset's own completion              otherwise, without seq_kd
    "teacher": the teacher samples (sequence-level KD)   otherwise, with seq_kd
The draw depends only on (seed, step, micro-batch), so every process makes the same choice without
communicating, and a resumed run makes the same choices as an uninterrupted one.

Generation is batched per source over the whole step (all of this process's micro-batches at once): the
student generates once, the teacher once, and only for the micro-batches that use their output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from distill.data import Example

SOURCES = ("student", "dataset", "teacher")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    do_sample: bool = True


@dataclass
class Completion:
    """One prompt with its completion, as token ids (completion ends at its first EOS, which is kept).

    `example` is the dataset example it came from (its text and index), for teachers that need more than
    the student's token ids: another tokenizer's rendering, a cache keyed by example id, a teacher route.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    source: str
    hit_max_new_tokens: bool = False
    prompt_truncated: bool = False
    example: Example | None = None


@dataclass
class MicroBatch:
    """Token tensors of one micro-batch, right-padded: [prompt | completion | pad].

    input_ids, attention_mask: (B, T) torch.long.
    completion_mask: (B, T) bool, True at completion tokens (the ones trained on).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor
    source: str
    completions: list[Completion] = field(repr=False)

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_mask.sum())

    def to(self, device: torch.device) -> "MicroBatch":
        return MicroBatch(self.input_ids.to(device), self.attention_mask.to(device), self.completion_mask.to(device), self.source, self.completions)


def draw_sources(lmbda: float, seq_kd: bool, seed: int, step: int, num_micro_batches: int) -> list[str]:
    """The source of each micro-batch of optimizer step `step`; identical on every process."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
    draws = torch.rand(num_micro_batches, generator=generator, dtype=torch.float64)
    off_policy = "teacher" if seq_kd else "dataset"
    return ["student" if float(u) < lmbda else off_policy for u in draws]


def first_eos_mask(tokens: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """(B, L) bool: True up to and including each row's first EOS, False after it (pad == eos is safe)."""
    if not eos_ids:
        return torch.ones_like(tokens, dtype=torch.bool)
    is_eos = torch.isin(tokens, torch.tensor(eos_ids, device=tokens.device))
    eos_seen_before = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return ~eos_seen_before


@torch.no_grad()
def generate_completions(
    model,
    prompts: list[list[int]],
    sampling: SamplingParams,
    eos_ids: list[int],
    pad_id: int,
    device: torch.device,
    batch_size: int | None = None,
    stopping_criteria=None,
    vocab_size: int | None = None,
) -> list[tuple[list[int], bool]]:
    """Sample a completion for each prompt with HF generate (KV cache, left padding).

    Returns, per prompt, (completion ids ending at the first EOS, whether it stopped at max_new_tokens).
    `stopping_criteria` (a transformers StoppingCriteriaList) may end rows early; the caller then cuts them.
    `vocab_size`: the tokenizer's size; rows of an output embedding padded past it (e.g. to a multiple of 64)
    are never sampled, since those ids mean nothing to the tokenizer or the loss.
    """
    results: list[tuple[list[int], bool]] = []
    batch_size = batch_size or max(len(prompts), 1)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start : start + batch_size]
            width = max(len(p) for p in chunk)
            input_ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, ids in enumerate(chunk):
                input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
                attention_mask[row, width - len(ids) :] = 1
            kwargs = dict(
                max_new_tokens=sampling.max_new_tokens,
                do_sample=sampling.do_sample,
                eos_token_id=eos_ids or None,
                pad_token_id=pad_id,
            )
            if sampling.do_sample:
                kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
            if stopping_criteria is not None:
                kwargs["stopping_criteria"] = stopping_criteria
            padded_rows = _output_rows(model) - vocab_size if vocab_size is not None else 0
            if padded_rows > 0:
                kwargs["suppress_tokens"] = list(range(vocab_size, vocab_size + padded_rows))
            output = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs)
            generated = output[:, width:].cpu()
            keep = first_eos_mask(generated, eos_ids)
            for row in range(len(chunk)):
                ids = generated[row][keep[row]].tolist()
                ended = bool(ids) and ids[-1] in eos_ids
                results.append((ids, not ended and len(ids) >= sampling.max_new_tokens))
    finally:
        model.train(was_training)
    return results


def _output_rows(model) -> int:
    head = model.get_output_embeddings()
    return head.weight.shape[0] if head is not None else 0


def collate(completions: list[Completion], source: str, pad_id: int) -> MicroBatch:
    """Right-padded token tensors for one micro-batch; torch.long even when every completion is empty."""
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c in completions]
    width = max(lengths)
    input_ids = torch.full((len(completions), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(completions), width), dtype=torch.long)
    completion_mask = torch.zeros((len(completions), width), dtype=torch.bool)
    for row, c in enumerate(completions):
        tokens = torch.tensor(c.prompt_ids + c.completion_ids, dtype=torch.long)
        input_ids[row, : len(tokens)] = tokens
        attention_mask[row, : len(tokens)] = 1
        completion_mask[row, len(c.prompt_ids) : len(tokens)] = True
    return MicroBatch(input_ids, attention_mask, completion_mask, source, completions)
