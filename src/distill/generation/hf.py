"""transformers' `generate` as an engine: any model, KV cache, left padding."""

from __future__ import annotations

from typing import Any

import torch

from distill.generation.engine import DecodeRequest, Engine


class HFGenerate(Engine):
    name = "hf"
    label = "HF generate"
    auto_order = 1  # after the lean loop, which decodes the models it takes faster
    takes_extras = True

    def refusal(self, model, device: torch.device) -> str | None:
        return None

    def decode(self, model, request: DecodeRequest) -> tuple[torch.Tensor, torch.Tensor | None]:
        # Without `seeded_rows` this engine samples on torch's process RNG, which the run seeds and checkpoints (engine.py).
        sampling, device, with_log_probs = request.sampling, request.device, request.with_log_probs
        generators = request.row_generators() if sampling.do_sample else None
        input_ids, attention_mask = request.input_ids.to(device), request.attention_mask.to(device)
        kwargs: dict[str, Any] = dict(  # generate's keyword arguments
            max_new_tokens=sampling.max_new_tokens,
            do_sample=sampling.do_sample,
            eos_token_id=request.stop_ids or None,
            pad_token_id=request.pad_id,
            # transformers turns synced_gpus on for an FSDP-managed model (every process steps until all are
            # done); distill generates on a gathered student (`distill.models.sharding.gathered`), which needs no sync.
            synced_gpus=False,
        )
        seeded = None
        if generators is not None:  # generate decodes greedily the one token the seeded sampler leaves
            seeded = SeededSampler(sampling, generators)
            kwargs.update(do_sample=False, logits_processor=seeded.processors)
        elif sampling.do_sample:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k)
        if request.stopping_criteria is not None:
            kwargs["stopping_criteria"] = request.stopping_criteria
        if request.suppress_ids:
            kwargs["suppress_tokens"] = request.suppress_ids
        if with_log_probs and seeded is None:
            kwargs.update(output_scores=True, return_dict_in_generate=True)
        extras = {name: value.to(device) for name, value in request.extras.items()}
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **extras, **kwargs)
        if seeded is not None:
            generated = output[:, input_ids.shape[1]:].cpu()
            return generated, (seeded.log_probs(generated.shape[1]) if with_log_probs else None)
        sequences = output.sequences if with_log_probs else output
        generated = sequences[:, input_ids.shape[1]:].cpu()
        return generated, (sampled_log_probs(output.scores, generated) if with_log_probs else None)


class SeededSampler:
    """Sampling inside `generate` from per-row generators (`DecodeRequest.seeded_rows`): transformers' own warpers
    (temperature, top-k, top-p, in `generate`'s order), then a processor that draws each row's token by the lean loop's
    inverse CDF from the row's generator and leaves only that token finite, which greedy decoding then picks. It
    records each drawn token's log-prob under the warped scores (what `output_scores` gives when sampling)."""

    def __init__(self, sampling, generators: list[torch.Generator]):
        from distill.generation.lean_decode import logits_processors

        self.generators = generators
        self.steps: list[torch.Tensor] = []
        self.processors = logits_processors(True, sampling.temperature, sampling.top_k, sampling.top_p, [])
        self.processors.append(self._draw)

    def _draw(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        from distill.generation.lean_decode import sample_from_logits

        tokens = sample_from_logits(scores, self.generators).to(scores.device)
        self.steps.append(torch.log_softmax(scores.float(), dim=-1).gather(1, tokens[:, None]).squeeze(1).cpu())
        chosen = torch.full_like(scores, float("-inf"))
        chosen.scatter_(1, tokens[:, None], 0.0)
        return chosen

    def log_probs(self, length: int) -> torch.Tensor:
        """(B, length) float32: the drawn tokens' log-probs, step by step."""
        return torch.stack(self.steps[:length], dim=1) if self.steps else torch.zeros(len(self.generators), 0)


def sampled_log_probs(scores: tuple[torch.Tensor, ...], generated: torch.Tensor) -> torch.Tensor:
    """(B, L) float32: log softmax of each step's processed scores (B, V) at the token sampled there."""
    columns = [torch.log_softmax(step.float(), dim=-1).gather(1, generated[:, t : t + 1].to(step.device)).squeeze(1).cpu()
               for t, step in enumerate(scores)]
    return torch.stack(columns, dim=1) if columns else torch.zeros(generated.shape[0], 0)
