"""The CPU training process fixes glibc's mmap threshold: 4 MiB for training, 64 KiB under FSDP."""

import platform

import pytest

from distill.training import cpu_memory


@pytest.mark.skipif("glibc" not in (platform.libc_ver()[0] or ""), reason="mallopt is glibc's")
def test_glibc_accepts_the_thresholds_and_logs_them(caplog):
    caplog.set_level("INFO", logger="distill.training.cpu_memory")
    assert cpu_memory.set_mmap_threshold(cpu_memory.TRAINING_THRESHOLD, "test")
    assert "mmap threshold fixed at 4096 KiB" in caplog.text


def test_training_runtime_sets_the_training_threshold(tokenizer, tmp_path, monkeypatch):
    from tests.helpers.training import make_distiller

    calls = []
    monkeypatch.setattr(cpu_memory, "set_mmap_threshold", lambda size, why: calls.append((size, why)) or True)
    make_distiller(tokenizer, tmp_path)
    assert calls == [(cpu_memory.TRAINING_THRESHOLD, "training on CPU")]
