"""From a micro-batch of token ids to the loss sum: backbones give hidden states, the chunked loss the rest.

Only the positions that predict completion tokens reach either lm_head (a prompt position is never
projected to the vocabulary). The student's part runs inside `StudentObjective.forward`, so a
DDP/FSDP/DeepSpeed wrapper from accelerate sees the whole computation: FSDP gathers the lm_head weight
there, DDP's gradient hooks see every parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from distill.losses import DistillLoss, LogitHead, chunked_generalized_jsd
from distill.models import logit_head


def predicting_positions(completion_mask: torch.Tensor) -> torch.Tensor:
    """(B, T-1) bool: positions whose next-token distribution predicts a completion token."""
    return completion_mask[:, 1:]


def backbone_hidden(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Last hidden states (B, T, H) of a causal LM's decoder, without computing any logits."""
    decoder = model.get_decoder()
    return decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state


class LocalTeacher:
    """A same-tokenizer teacher on this process: hidden states at completion positions, and its lm_head."""

    def __init__(self, model: nn.Module, vocab_size: int):
        self.model = model.eval().requires_grad_(False)
        self.head: LogitHead = logit_head(model, vocab_size)

    @torch.inference_mode()
    def hidden_states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
        """(N, H_t) teacher hidden states at the N completion-predicting positions, in row-major order."""
        hidden = backbone_hidden(self.model, input_ids, attention_mask)
        return hidden[:, :-1][predicting_positions(completion_mask)].clone()


class StudentObjective(nn.Module):
    """Wraps the student so that forward returns the distillation loss sum of a micro-batch."""

    def __init__(self, student: nn.Module, vocab_size: int):
        super().__init__()
        self.student = student
        self.vocab_size = vocab_size

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        completion_mask: torch.Tensor,
        teacher_hidden: torch.Tensor,
        teacher_head: LogitHead,
        beta: float,
        temperature: float,
        chunk_size: int,
        return_stats: bool = False,
    ) -> DistillLoss:
        hidden = backbone_hidden(self.student, input_ids, attention_mask)
        student_hidden = hidden[:, :-1][predicting_positions(completion_mask)]
        head = logit_head(self.student, self.vocab_size)
        # The loss manages its own precision (fp32 accumulation); autocast must not touch its matmuls.
        with torch.autocast(device_type=student_hidden.device.type, enabled=False):
            return chunked_generalized_jsd(
                student_hidden,
                head.weight,
                teacher_hidden.to(student_hidden.device),
                teacher_head.weight,
                beta=beta,
                temperature=temperature,
                chunk_size=chunk_size,
                student_bias=head.bias,
                teacher_bias=teacher_head.bias,
                student_logit_scale=head.scale,
                teacher_logit_scale=teacher_head.scale,
                student_softcap=head.softcap,
                teacher_softcap=teacher_head.softcap,
                return_stats=return_stats,
            )
