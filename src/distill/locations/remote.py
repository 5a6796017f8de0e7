"""What the two locations of a teacher outside the process (a server, a cache) share: the payload they give
(`teacher_payload`: sparse top-k log-probs, or the teacher's hidden states that its head on the trainer makes
into the full distribution, a dense signal), their fields' ranges, and one teacher per route (several routed
by teacher_id)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.locations.external import ExternalLocation
from distill.methods.base import Method
from distill.settings.locations import RemoteTeacherFields
from distill.signals import DENSE, SPARSE

if TYPE_CHECKING:
    from distill.config import DistillConfig

PAYLOADS = ("topk", "hidden")
HIDDEN_DTYPES = ("float32", "bfloat16")


def hidden_payload(config: DistillConfig) -> bool:
    return RemoteTeacherFields.of(config).teacher_payload == "hidden"


class RemoteLocation(ExternalLocation):
    """A teacher that only scores: K top log-probs per position and the completion token's, or hidden states."""

    field: str = ""  # the config field naming it (teacher_url / teacher_cache)

    def signal_kind(self, method: Method, config: DistillConfig) -> str:
        return DENSE if hidden_payload(config) else SPARSE

    def gives(self, method: Method, config: DistillConfig) -> str:
        if hidden_payload(config):
            return f"the teacher's hidden states from {self.field} (teacher_payload: hidden)"
        return f"sparse top-k log-probs from {self.field}"

    def describe(self, config: DistillConfig) -> str:
        return self.field

    def validate(self, config: DistillConfig, method: Method, sources: frozenset[str]) -> None:
        own = RemoteTeacherFields.of(config)
        if own.teacher_payload not in PAYLOADS:
            raise ValueError(f"teacher_payload must be one of {PAYLOADS}, got {own.teacher_payload!r}")
        super().validate(config, method, sources)
        if own.teacher_logprobs < 1:
            raise ValueError(f"teacher_logprobs must be >= 1, got {own.teacher_logprobs!r}")
