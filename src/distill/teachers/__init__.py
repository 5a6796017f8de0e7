"""Teachers: what scores the student's completions, and the signal each hands to the loss.

- `LocalTeacher`: a same-tokenizer model on this process (`DenseSignal`, full vocabulary).
- `SparseSignal`: top-k log-probs + sampled token + tail, from a server (`server.ServerTeacher`) or a disk
  cache (`offline.OfflineTeacher`, format in `cache`); `routed.RoutedTeacher` sends each row to its teacher_id's.
- `CrossTokenizerTeacher`: a teacher with another tokenizer (method gold), byte-aligned (`AlignedSignal`).
"""

from distill.teachers.base import (
    DenseSignal,
    LossSettings,
    SparseSignal,
    Teacher,
    TeacherSignal,
    concat_sparse,
)
from distill.teachers.cross_tokenizer import AlignedSignal, CrossTokenizerTeacher
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)
from distill.teachers.local import LocalTeacher

__all__ = [
    "AlignedSignal",
    "CrossTokenizerTeacher",
    "DenseSignal",
    "LocalTeacher",
    "LossSettings",
    "SparseSignal",
    "Teacher",
    "TeacherSignal",
    "backbone_hidden",
    "completion_targets",
    "concat_sparse",
    "predicting_positions",
]
