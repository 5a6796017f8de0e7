"""What the two locations of a teacher outside the process (a server, a cache) share: the payload they give
(`teacher_payload`: sparse top-k log-probs, or the teacher's hidden states that its head on the trainer makes
into the full distribution, a dense signal), their fields' ranges, and one teacher per route (several routed
by teacher_id)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distill.locations.external import ExternalLocation
from distill.methods.registry import Method
from distill.signals import DENSE, SPARSE

if TYPE_CHECKING:
    from distill.config import DistillConfig

PAYLOADS = ("topk", "hidden")
HIDDEN_DTYPES = ("float32", "bfloat16")


def hidden_payload(config: DistillConfig) -> bool:
    return config.teacher_payload == "hidden"


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
        if config.teacher_payload not in PAYLOADS:
            raise ValueError(f"teacher_payload must be one of {PAYLOADS}, got {config.teacher_payload!r}")
        if config.teacher_hidden_dtype not in HIDDEN_DTYPES:
            raise ValueError(f"teacher_hidden_dtype must be one of {HIDDEN_DTYPES}, got {config.teacher_hidden_dtype!r}")
        super().validate(config, method, sources)
        for name in ("teacher_logprobs", "teacher_concurrency", "teacher_request_size"):
            if getattr(config, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
        if not config.teacher_timeout > 0 or config.teacher_retries < 0:
            raise ValueError("teacher_timeout must be > 0 and teacher_retries >= 0")
