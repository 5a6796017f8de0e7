"""Several teachers, each example routed to one by its dataset `teacher_id`; the loss is reported per teacher."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distill.losses import DistillLoss, TokenStats
from distill.rollout import MicroBatch, collate
from distill.teachers.base import LossSettings, TeacherSignal


@dataclass
class RoutedSignal:
    """parts: (teacher id, positions (M,) long into the micro-batch's N positions, that teacher's signal)."""

    parts: list[tuple[str, torch.Tensor, TeacherSignal]]

    def to(self, device: torch.device) -> "RoutedSignal":
        return RoutedSignal([(tid, idx.to(device), signal.to(device)) for tid, idx, signal in self.parts])

    def loss(self, student_hidden, student_head, targets, settings: LossSettings) -> DistillLoss:
        n = student_hidden.shape[0]
        loss_sum = student_hidden.new_zeros((), dtype=torch.float32)
        num_tokens = torch.zeros((), dtype=torch.long, device=student_hidden.device)
        stats = None
        groups = {}
        for tid, index, signal in self.parts:
            out = signal.loss(student_hidden.index_select(0, index), student_head, targets.index_select(0, index), settings)
            loss_sum = loss_sum + out.loss_sum
            num_tokens = num_tokens + out.num_tokens
            groups[tid] = (out.loss_sum.detach(), out.num_tokens)
            if out.stats is not None:
                if stats is None:
                    stats = [torch.zeros(n, dtype=torch.float32, device=student_hidden.device) for _ in out.stats]
                for column, values in zip(stats, out.stats):
                    column.index_copy_(0, index, values.float())
        return DistillLoss(loss_sum, num_tokens, TokenStats(*stats) if stats is not None else None, groups)


class RoutedTeacher:
    """Splits a micro-batch by teacher id, scores each part with its teacher, keeps the positions' order."""

    can_generate = False

    def __init__(self, teachers: dict[str, object], pad_id: int):
        self.teachers, self.pad_id = teachers, pad_id

    def score(self, batch: MicroBatch, temperature: float) -> RoutedSignal:
        return self.score_many([batch], temperature)[0]

    def score_many(self, batches: list[MicroBatch], temperature: float) -> list[RoutedSignal]:
        """Every micro-batch of a step: each teacher scores all its rows of the step in one call."""
        plans, requests = [], {}  # plans[b]: (teacher id, positions of its rows in batch b); requests[tid]: sub-batches
        for batch in batches:
            lengths = [len(c.completion_ids) for c in batch.completions]
            starts = torch.tensor([0, *lengths]).cumsum(0)
            rows_by_teacher: dict[str, list[int]] = {}
            for row, completion in enumerate(batch.completions):
                tid = completion.example.teacher_id if completion.example is not None else None
                if tid not in self.teachers:
                    raise ValueError(f"example {getattr(completion.example, 'index', '?')}: teacher_id {tid!r} is not one of "
                                     f"{sorted(self.teachers)}")
                rows_by_teacher.setdefault(tid, []).append(row)
            plan = []
            for tid, rows in rows_by_teacher.items():
                positions = torch.cat([torch.arange(int(starts[r]), int(starts[r + 1])) for r in rows]).long()
                plan.append((tid, positions, len(requests.setdefault(tid, []))))
                requests[tid].append(collate([batch.completions[r] for r in rows], batch.source, self.pad_id))
            plans.append(plan)
        signals = {}
        for tid, sub_batches in requests.items():
            teacher = self.teachers[tid]
            score_many = getattr(teacher, "score_many", None)
            signals[tid] = (score_many(sub_batches, temperature) if score_many is not None
                            else [teacher.score(sub, temperature) for sub in sub_batches])
        return [RoutedSignal([(tid, positions, signals[tid][slot]) for tid, positions, slot in plan]) for plan in plans]
