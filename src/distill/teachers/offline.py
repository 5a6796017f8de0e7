"""A teacher read from disk (`teacher_cache`): sparse log-probs, or hidden states with the teacher's head (a
dense signal, exact at any temperature), from a `distill cache-teacher` directory."""

from __future__ import annotations

import torch

from distill.batch import MicroBatch
from distill.signals import DenseSignal, SparseSignal
from distill.teachers.base import Teacher
from distill.teachers.cache import TeacherCache
from distill.teachers.cache.reader import CachedExample, CachedHidden


class OfflineTeacher(Teacher):
    """Looks up each completion's example id in the cache; the completion must be the cached one.

    The cache holds the teacher's signal at every completion token, so any trained mask of the run is served
    from it: the rows at the trained tokens are picked (a run that skips leading tokens, or a trajectory's
    environment tokens, reads the same cache)."""

    can_generate = False
    frozen = True  # its weights never change during the run (`Teacher.frozen`)

    def __init__(self, cache: TeacherCache):
        self.cache = cache

    def score(self, batch: MicroBatch, temperature: float) -> SparseSignal | DenseSignal:
        hidden = self.cache.payload == "hidden"
        if not hidden and abs(temperature - self.cache.temperature) > 1e-9:
            raise ValueError(f"teacher_cache holds log-probs at temperature {self.cache.temperature}, not {temperature}")
        parts = []
        for completion in batch.completions:
            if completion.example is None:
                raise ValueError("an offline teacher scores dataset examples only (this completion has no example id)")
            entry = self.cache.get(completion.example.index)
            if entry.tokens.tolist() != list(completion.completion_ids):
                raise ValueError(f"example {completion.example.index}: the completion is not the one the cache scored")
            parts.append((entry, torch.tensor(completion.trained_indices(), dtype=torch.long)))
        if hidden:
            head = self.cache.head
            assert head is not None  # a hidden cache holds its head
            width = head.weight.shape[1]
            states = torch.cat([_hidden(entry)[rows] for entry, rows in parts]) if parts else torch.empty(0, width)
            return DenseSignal(states, head)
        k = self.cache.top_k
        cat = lambda name, empty: torch.cat([getattr(e, name)[rows] for e, rows in parts]) if parts else empty  # noqa: E731
        return SparseSignal(cat("topk_ids", torch.empty(0, k, dtype=torch.long)), cat("topk_logprobs", torch.empty(0, k)),
                            cat("token_logprobs", torch.empty(0)), cat("tail_logprobs", torch.empty(0)), self.cache.temperature)


def _hidden(entry: CachedExample | CachedHidden) -> torch.Tensor:
    assert isinstance(entry, CachedHidden)  # a hidden cache's entries
    return entry.hidden
