"""Teachers: what scores the student's completions, and the signal (`distill.signals`) each gives.

- `LocalTeacher`: a same-tokenizer model on this process (dense signal, full vocabulary).
- `topk_client.ServerTeacher` / `offline.OfflineTeacher`: sparse top-k log-probs + the token's + a tail, from a
  server (the client of one) or a disk cache (format in `cache`); `routed.RoutedTeacher` sends each row to its
  teacher_id's. `hidden_client.HiddenStateServerTeacher`: a server's final hidden states (dense or aligned).
- `CrossTokenizerTeacher`: a teacher with another tokenizer (method gold), byte-aligned (aligned signal).
- `build`: the one construction path every command takes.
"""

from distill.teachers.base import Teacher
from distill.teachers.cross_tokenizer import CrossTokenizerTeacher
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)
from distill.teachers.local import LocalTeacher

__all__ = [
    "CrossTokenizerTeacher",
    "LocalTeacher",
    "Teacher",
    "backbone_hidden",
    "completion_targets",
    "predicting_positions",
]
