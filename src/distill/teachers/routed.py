"""Several teachers, each example routed to one by its dataset `teacher_id` (objectives report the loss per teacher)."""

from __future__ import annotations

import torch

from distill.batch import MicroBatch, collate
from distill.signals import RoutedSignal
from distill.teachers.base import Teacher


class RoutedTeacher(Teacher):
    """Splits a micro-batch by teacher id, scores each part with its teacher, keeps the positions' order."""

    can_generate = False

    def __init__(self, teachers: dict[str, Teacher], pad_id: int):
        self.teachers, self.pad_id = teachers, pad_id

    @property
    def frozen(self) -> bool:
        return all(teacher.frozen for teacher in self.teachers.values())

    def close(self) -> None:
        for teacher in self.teachers.values():
            teacher.close()

    def score(self, batch: MicroBatch, temperature: float) -> RoutedSignal:
        return self.score_many([batch], temperature)[0]

    def score_many(self, batches: list[MicroBatch], temperature: float) -> list[RoutedSignal]:
        """Every micro-batch of a step: each teacher scores all its rows of the step in one call."""
        plans: list[list[tuple[str, torch.Tensor, int]]] = []
        requests: dict[str, list[MicroBatch]] = {}  # plans[b]: (teacher id, positions of its rows in batch b); requests[tid]: sub-batches
        for batch in batches:
            lengths = [c.num_trained for c in batch.completions]  # each row's positions in the batch's N
            starts = torch.tensor([0, *lengths]).cumsum(0)
            rows_by_teacher: dict[str, list[int]] = {}
            for row, completion in enumerate(batch.completions):
                tid = completion.example.teacher_id if completion.example is not None else None
                if tid not in self.teachers:
                    index = completion.example.index if completion.example is not None else "?"
                    raise ValueError(f"example {index}: teacher_id {tid!r} is not one of "
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
            signals[tid] = self.teachers[tid].score_many(sub_batches, temperature)
        return [RoutedSignal([(tid, positions, signals[tid][slot]) for tid, positions, slot in plan]) for plan in plans]
