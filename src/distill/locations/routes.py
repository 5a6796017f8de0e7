"""Several teachers in one run, routed by each dataset row's `teacher_id`: the `id=target,id=target` form."""

from __future__ import annotations


def parse_routes(value: str, name: str) -> dict[str, str]:
    """'target' -> {"": target}; 'a=target,b=target' -> {"a": ..., "b": ...} (teachers routed by teacher_id)."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if len(parts) == 1 and "=" not in parts[0].split("://")[0]:
        return {"": parts[0]}
    routes = {}
    for part in parts:
        key, sep, target = part.partition("=")
        if not sep or not key.strip() or not target.strip() or "://" in key:
            raise ValueError(f"{name}: expected one target or 'id=target,id=target', got {value!r}")
        if key.strip() in routes:
            raise ValueError(f"{name}: teacher id {key.strip()!r} appears twice")
        routes[key.strip()] = target.strip()
    if not routes:
        raise ValueError(f"{name} is empty")
    return routes
