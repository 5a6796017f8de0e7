"""A same-tokenizer teacher model on this process."""

from __future__ import annotations

import torch
from torch import nn

from distill.batch import MicroBatch
from distill.generation import SamplingParams, generate_completions
from distill.generation.sample import Sample
from distill.losses import LogitHead
from distill.models import logit_head
from distill.no_grad import inference_mode
from distill.signals import DenseSignal
from distill.teachers.base import Teacher
from distill.teachers.hidden import backbone_hidden, predicting_positions


class LocalTeacher(Teacher):
    """Teacher hidden states at completion positions plus its lm_head (a `DenseSignal`); samples for seq_kd."""

    can_generate = True
    continues_prompts = True  # it samples from the student's own ids
    frozen = True  # its weights never change during the run (`Teacher.frozen`)
    head: LogitHead  # always held

    def __init__(self, model: nn.Module, vocab_size: int, eos_ids: list[int], pad_id: int, device: torch.device):
        self.model = model.eval().requires_grad_(False)
        self.head = logit_head(model, vocab_size)
        self.eos_ids, self.pad_id, self.device = eos_ids, pad_id, device

    @inference_mode
    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor,
                      extras: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """(N, H_t) teacher hidden states at the N completion-predicting positions, in row-major order; `extras`:
        the batch's inputs beyond the ids (the student's, for a teacher of its kind)."""
        hidden = backbone_hidden(self.model, input_ids, attention_mask, extras)
        return hidden[:, :-1][predicting_positions(completion_mask)].clone()

    def score(self, batch: MicroBatch, temperature: float) -> DenseSignal:
        # The full distribution travels as hidden states: the loss applies `temperature` to both sides.
        return DenseSignal(self.hidden_states(batch.input_ids, batch.attention_mask, batch.completion_mask, batch.extras),
                           self.head)

    def sampling_models(self, visit) -> None:
        """`visit(model)` for the model `generate` samples from (a generation engine prepares it)."""
        visit(self.model)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams, batch_size: int | None = None,
                 examples=None, seeds: list[int] | None = None, extras=None, seeded_rows: bool = False) -> list[Sample]:
        """Samples from the student's prompt ids (same tokenizer) and extras; `examples` is not needed."""
        return generate_completions(self.model, prompts, sampling, self.eos_ids, self.pad_id, self.device, batch_size,
                                    vocab_size=self.head.vocab_size, seeds=seeds, extras=extras, seeded_rows=seeded_rows)
