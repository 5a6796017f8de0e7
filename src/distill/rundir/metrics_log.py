"""The run directory's metrics.jsonl: one JSON line per logging step, appended by the main process and read back by
the plots and tests."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLog:
    """Appends one JSON line per logging step to metrics.jsonl (main process only)."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
