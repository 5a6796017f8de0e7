"""Teachers: what scores the student's completions, and the signal each hands to the loss.

- `LocalTeacher`: a same-tokenizer model on this process (`DenseSignal`, full vocabulary).
- `SparseSignal`: top-k log-probs + sampled token + tail, from a server or a disk cache.
"""

from distill.teachers.base import (
    DenseSignal,
    LossSettings,
    SparseSignal,
    Teacher,
    TeacherSignal,
    concat_sparse,
)
from distill.teachers.hidden import (
    backbone_hidden,
    completion_targets,
    predicting_positions,
)
from distill.teachers.local import LocalTeacher

__all__ = [
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
