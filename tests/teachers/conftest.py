"""Shared by the cache tests: the rows every cache is written from (two teacher routes, multi-byte text)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import chat_rows


def cache_rows(n: int = 10) -> list[dict]:
    rows = chat_rows(n)
    for i, row in enumerate(rows):
        row["completion"] += " déjà vu 東京 🙂"
        row["teacher_id"] = "a" if i % 2 else "b"
    return rows


@pytest.fixture(scope="session")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in cache_rows()))
    return path
