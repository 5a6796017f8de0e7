"""The vision feature (vision-language students): its setting and what it reads. A leaf, composed into `DistillConfig`
when the feature is declared (`distill.parts`); the model kind that reads images is `distill.models.kinds`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from distill.config.io import PartFields, setting
from distill.features import Feature
from distill.registry import Reads


@dataclass
class VisionFields(PartFields):
    """A vision-language student's training choices."""

    placed_after: ClassVar[str] = "gradient_checkpointing"

    train_vision_tower: bool = setting(False, "A vision-language student: train its vision tower and projector too "
                                       "(frozen by default: the loss is on text, and the teacher sees the same pixels).")


class Vision(Feature):
    """Vision-language students: every run reads `train_vision_tower` (a text-only student has no tower to train)."""

    name = "vision"
    fields = (VisionFields,)

    def reads(self, sources: frozenset[str]) -> tuple[Reads, ...]:
        return (Reads("every run", ("train_vision_tower",)),)
