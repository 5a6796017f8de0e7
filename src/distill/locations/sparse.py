"""What the two locations that give sparse top-k log-probs (a server, a cache) share: the K they give, their
fields' ranges, and one teacher per route (several routed by teacher_id)."""

from __future__ import annotations

from distill.locations.external import ExternalLocation
from distill.methods.registry import Method
from distill.signals import SPARSE


class SparseLocation(ExternalLocation):
    """A teacher that only scores, with K top log-probs per position and the completion token's."""

    field: str = ""  # the config field naming it (teacher_url / teacher_cache)

    def signal_kind(self, method: Method) -> str:
        return SPARSE

    def gives(self, method: Method) -> str:
        return f"sparse top-k log-probs from {self.field}"

    def describe(self, config) -> str:
        return self.field

    def validate(self, config, method: Method, sources: frozenset[str]) -> None:
        super().validate(config, method, sources)
        for name in ("teacher_logprobs", "teacher_concurrency", "teacher_request_size"):
            if getattr(config, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(config, name)!r}")
        if not config.teacher_timeout > 0 or config.teacher_retries < 0:
            raise ValueError("teacher_timeout must be > 0 and teacher_retries >= 0")
