"""Argument checks shared by every loss: each failure is a ValueError that names the argument."""

from __future__ import annotations

import math

import torch


def check_beta(beta: float) -> float:
    """`beta` interpolates forward KL (0) and reverse KL (1); anything outside [0, 1] is not a divergence."""
    value = float(beta)
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise ValueError(f"beta must be in [0, 1] (0 = forward KL, 1 = reverse KL), got {beta!r}")
    return value


def check_temperature(temperature: float) -> float:
    value = float(temperature)
    if not value > 0.0 or math.isinf(value):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return value


def check_chunk_size(chunk_size: int) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    return chunk_size


def check_same_vocab(student_vocab: int, teacher_vocab: int, what: str) -> None:
    if student_vocab != teacher_vocab:
        raise ValueError(
            f"{what}: student vocabulary size {student_vocab} != teacher vocabulary size {teacher_vocab}. "
            "Token-level distillation needs one shared tokenizer; for a teacher with another tokenizer "
            "use cross-tokenizer distillation (method: gold)."
        )


def check_matrix(name: str, tensor: torch.Tensor, rows: int | None = None, cols: int | None = None) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 2:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name} must be a 2-D tensor, got {shape}")
    if rows is not None and tensor.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows, got shape {tuple(tensor.shape)}")
    if cols is not None and tensor.shape[1] != cols:
        raise ValueError(f"{name} must have {cols} columns, got shape {tuple(tensor.shape)}")


def check_mask(mask: torch.Tensor | None, n: int, name: str = "mask") -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.shape != (n,):
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must have shape ({n},) (one entry per token), got {shape}")
    return mask.bool()
