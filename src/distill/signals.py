"""Teacher signals: what a teacher says about a micro-batch, as plain data.

A teacher scores a micro-batch and returns one signal covering its N completion-predicting positions, in
row-major order. Signals carry no loss: the method's objective (`distill.objectives`) decides what to
compute from them, so a new objective over an existing teacher needs no new signal class.

    kind       signal          given by
    "dense"    DenseSignal     a same-tokenizer model on this process: hidden states + lm_head (full vocabulary);
                               SelfSignal: the same from a self-teacher, with counts of its prompts
    "sparse"   SparseSignal    a server or a disk cache: top-k log-probs, the completion token's, a tail
    "aligned"  AlignedSignal   a model with another tokenizer: byte-aligned token groups (GOLD / ULD)
    (routed)   RoutedSignal    several teachers by teacher_id: each part is one of the above
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from distill.losses import LogitHead
from distill.losses.uld import Alignment, ULDSettings

DENSE, SPARSE, ALIGNED = "dense", "sparse", "aligned"


@dataclass
class DenseSignal:
    """A same-vocabulary teacher's hidden states (N, H_t) and its lm_head: the full distribution, chunked."""

    hidden: torch.Tensor
    head: LogitHead
    kind = DENSE

    def to(self, device: torch.device) -> "DenseSignal":
        return replace(self, hidden=self.hidden.to(device))


@dataclass
class SelfSignal(DenseSignal):
    """A self-teacher's dense signal (`distill.teachers.self_teacher`), with what building its prompts did to
    the micro-batch's `rows`: how many teacher prompts were truncated and how many rows had no context.

    distilled: (N,) bool, the positions whose row gets a self-distillation loss (sdpo: rows with a
    demonstration or feedback; the others' teacher hidden states are zeros, never used), or None: all."""

    rows: int = 0
    prompts_truncated: int = 0
    rows_without_context: int = 0
    distilled: torch.Tensor | None = None

    def to(self, device: torch.device) -> "SelfSignal":
        return replace(self, hidden=self.hidden.to(device),
                       distilled=None if self.distilled is None else self.distilled.to(device))


@dataclass
class SparseSignal:
    """A teacher's top-k log-probs per position, at the loss temperature (a server, a cache).

    topk_ids: (N, K) long; topk_log_probs: (N, K) float; sampled_log_probs: (N,) the teacher log-prob of
    the completion token at each position (it joins the support when the top-k missed it), or None;
    tail_log_probs: (N,) log of the mass outside the top-k (exact, from a cache), or None to derive it.
    `temperature` is the one the log-probs were computed at: an objective refuses any other.
    """

    topk_ids: torch.Tensor
    topk_log_probs: torch.Tensor
    sampled_log_probs: torch.Tensor | None
    tail_log_probs: torch.Tensor | None
    temperature: float
    kind = SPARSE

    def to(self, device: torch.device) -> "SparseSignal":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return SparseSignal(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})


@dataclass
class AlignedSignal:
    """A cross-tokenizer teacher's view of a micro-batch, G aligned groups over N student rows.

    alignment: the group of each student row; teacher_hidden: (G, H_t) at the position predicting each
    group's last teacher token; teacher_log_prefix: (G,) the teacher's log-probs of each group's earlier
    tokens, at `temperature`; head: the teacher's lm_head; settings: plain or hybrid ULD (which tokens the
    two vocabularies share is a fact about the pair, so it travels with the signal).
    """

    alignment: Alignment
    teacher_hidden: torch.Tensor
    teacher_log_prefix: torch.Tensor
    head: LogitHead
    settings: ULDSettings
    temperature: float
    kind = ALIGNED

    def to(self, device: torch.device) -> "AlignedSignal":
        return replace(self, alignment=self.alignment.to(device), teacher_hidden=self.teacher_hidden.to(device),
                       teacher_log_prefix=self.teacher_log_prefix.to(device))


@dataclass
class RoutedSignal:
    """parts: (teacher id, positions (M,) long into the micro-batch's N positions, that teacher's signal)."""

    parts: list[tuple[str, torch.Tensor, DenseSignal | SparseSignal | AlignedSignal]]

    def to(self, device: torch.device) -> "RoutedSignal":
        return RoutedSignal([(tid, idx.to(device), signal.to(device)) for tid, idx, signal in self.parts])
