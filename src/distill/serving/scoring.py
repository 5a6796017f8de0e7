"""The scoring side of `distill serve-teacher`: a teacher model's top-K log-probs (vLLM's prompt_logprobs shape) and
final hidden states (`ScoringEngine`), and the `Batcher` that runs every waiting request in padded passes of at most
`max_batch_tokens` on one worker thread."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import torch

from distill.losses import LogitHead
from distill.models import context_length, logit_head
from distill.models.inputs import collate_extras
from distill.models.vision import image_inputs, is_vision_language, processor_of
from distill.no_grad import inference_mode
from distill.teachers.head import head_fingerprint
from distill.teachers.hidden import backbone_hidden
from distill.teachers.hidden_payload import DTYPES
from distill.teachers.topk import topk_log_probs

logger = logging.getLogger("distill.commands.serve_teacher")


def padded_slices(prompts: list[list[int]], max_batch_tokens: int) -> list[slice]:
    """Consecutive runs of `prompts` whose padded size (rows x longest) fits `max_batch_tokens`; a prompt
    longer than the budget gets a run of its own. Order is kept, so answers line up with the prompts."""
    slices, start, width = [], 0, 0
    for end, prompt in enumerate(prompts):
        wider = max(width, len(prompt))
        if end > start and (end - start + 1) * wider > max_batch_tokens:
            slices.append(slice(start, end))
            start, wider = end, len(prompt)
        width = wider
    if prompts:
        slices.append(slice(start, len(prompts)))
    return slices


@dataclass
class ScoreJob:
    """prompts, and what to compute for them: key ("topk", k, temperature) or ("hidden", dtype name), with
    `starts` (the first predicted token of each prompt) for hidden states."""

    prompts: list[list[int]]
    key: tuple
    future: asyncio.Future = field(repr=False)
    starts: list[int] | None = None
    images: list[list] | None = None  # per prompt, its decoded images (a vision-language teacher), or None

    @property
    def width(self) -> int:
        return max(len(p) for p in self.prompts)


class ScoringEngine:
    """Runs the teacher over token-id prompts: per position the top-k and the actual token's log-prob."""

    def __init__(self, model, tokenizer, device: torch.device, chunk_size: int = 256):
        self.model, self.tokenizer, self.device, self.chunk_size = model.eval().requires_grad_(False), tokenizer, device, chunk_size
        self.vocab_size = len(tokenizer)
        self.head: LogitHead = logit_head(model, self.vocab_size)
        self.decoded = tokenizer.convert_ids_to_tokens(list(range(self.vocab_size)))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_model_len = context_length(model)
        self.hidden_size = self.head.weight.shape[1]
        self.head_sha256 = head_fingerprint(self.head)
        # A vision-language teacher reads each prompt's images through its own processor (`distill_images`).
        self.processor = processor_of(model) if is_vision_language(model) else None

    def run(self, key: tuple, prompts: list[list[int]], starts: list[int] | None, images: list[list] | None = None) -> list:
        """One result per prompt: a vLLM-shaped choice ("topk") or a (len - start, H) tensor ("hidden").
        `images`: per prompt, its decoded images (their placeholder tokens already in the prompt), or None."""
        if key[0] == "hidden":
            if starts is None:
                raise ValueError("hidden states are read from a start position per prompt; none was given")
            return self.hidden_states(prompts, starts, DTYPES[key[1]], images)
        return self.score(prompts, key[1], key[2], images)

    def _extras(self, images: list[list] | None, rows: int) -> dict[str, torch.Tensor]:
        if self.processor is None:
            if images and any(images):
                raise ValueError("this teacher is a text-only model; it takes no images")
            return {}
        rows_images = images if images is not None else [[] for _ in range(rows)]
        batch = collate_extras([image_inputs(self.processor, list(row)) for row in rows_images])
        return {name: value.to(self.device) for name, value in batch.items()}

    def _padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention[row, : len(ids)] = 1
        return input_ids.to(self.device), attention.to(self.device)

    @inference_mode
    def hidden_states(self, prompts: list[list[int]], starts: list[int], dtype: torch.dtype,
                      images: list[list] | None = None) -> list[torch.Tensor]:
        """Per prompt, the final hidden states (len - start, H) at positions start-1 .. len-2 (those predicting
        tokens start .. len-1), on the CPU in `dtype`."""
        input_ids, attention = self._padded(prompts)
        hidden = backbone_hidden(self.model, input_ids, attention, self._extras(images, len(prompts)))
        return [hidden[row, start - 1 : len(prompt) - 1].to("cpu", dtype) for row, (prompt, start) in enumerate(zip(prompts, starts))]

    @inference_mode
    def score(self, prompts: list[list[int]], k: int, temperature: float, images: list[list] | None = None) -> list[dict]:
        """One vLLM-shaped choice per prompt: prompt_logprobs and a greedy next token."""
        input_ids, attention = self._padded(prompts)
        hidden = backbone_hidden(self.model, input_ids, attention, self._extras(images, len(prompts)))
        # Positions 0..L-2 of each row predict tokens 1..L-1; position L-1 predicts the generated token.
        scored = attention.bool().clone()
        lengths = attention.sum(1)
        targets = input_ids.roll(-1, dims=1)
        last = torch.zeros_like(scored)
        last[torch.arange(len(prompts)), lengths - 1] = True
        predicting = scored & ~last
        top = topk_log_probs(hidden[predicting].float(), self.head, targets[predicting], k, temperature, self.chunk_size)
        next_logits = self.head.full_logits(hidden[last].float())
        next_ids = next_logits.argmax(-1).tolist()
        # JSON has no -inf: like vLLM, a zero-probability token gets -9999.
        ids = top.ids.tolist()
        lps, target_lp = top.log_probs.clamp_min(-9999.0).tolist(), top.target_log_probs.clamp_min(-9999.0).tolist()
        choices, position = [], 0
        for row, prompt in enumerate(prompts):
            entries: list[dict | None] = [None]
            for t in range(1, len(prompt)):
                entry = {str(i): {"logprob": lp, "rank": r + 1, "decoded_token": self.decoded[i]}
                         for r, (i, lp) in enumerate(zip(ids[position], lps[position]))}
                actual = prompt[t]
                if str(actual) not in entry:
                    entry[str(actual)] = {"logprob": target_lp[position], "rank": None, "decoded_token": self.decoded[actual]}
                entries.append(entry)
                position += 1
            choices.append({"index": row, "text": self.tokenizer.decode([next_ids[row]]), "logprobs": None,
                            "finish_reason": "length", "prompt_logprobs": entries, "prompt_token_ids": prompt})
        return choices


class Batcher:
    """Collects concurrent requests and runs them through the engine in batches, one batch at a time."""

    def __init__(self, engine: ScoringEngine, max_batch_tokens: int):
        self.engine, self.max_batch_tokens = engine, max_batch_tokens
        self.queue: asyncio.Queue[ScoreJob] = asyncio.Queue()
        self.worker: asyncio.Task | None = None

    def start(self) -> None:
        self.worker = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, prompts: list[list[int]], key: tuple, starts: list[int] | None = None,
                     images: list[list] | None = None) -> list:
        """One result per prompt (`ScoringEngine.run`)."""
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(ScoreJob(prompts, key, future, starts, images))
        return await future

    async def _run(self) -> None:
        while True:
            jobs = [await self.queue.get()]
            # The forward pass pads every row to the longest prompt: budget rows x width, not the sum of lengths.
            rows, width = len(jobs[0].prompts), jobs[0].width
            while not self.queue.empty():
                candidate = self.queue._queue[0]  # noqa: SLF001 (peek)
                if (rows + len(candidate.prompts)) * max(width, candidate.width) > self.max_batch_tokens:
                    break
                jobs.append(self.queue.get_nowait())
                rows, width = rows + len(candidate.prompts), max(width, candidate.width)
            # One forward per key ((k, temperature) or the hidden states' dtype): a batch's requests normally share it.
            groups: dict[tuple, list[ScoreJob]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            for key, group in groups.items():
                prompts = [p for job in group for p in job.prompts]
                starts = [s for job in group for s in (job.starts or [None] * len(job.prompts))]
                images = [i for job in group for i in (job.images or [[] for _ in job.prompts])]
                try:
                    results = []
                    for part in padded_slices(prompts, self.max_batch_tokens):
                        results += await asyncio.to_thread(self.engine.run, key, prompts[part], starts[part], images[part])
                except Exception as error:  # answered as a 500 on each request of the batch
                    for job in group:
                        if not job.future.done():
                            job.future.set_exception(error)
                    continue
                start = 0
                for job in group:
                    answers = results[start : start + len(job.prompts)]
                    start += len(job.prompts)
                    if not job.future.done():
                        job.future.set_result(answers)


