"""`phase_clock`: timings of a phase include the device work it queued (CUDA runs kernels asynchronously)."""

import time

import torch

from distill.training.runtime import phase_clock


def test_phase_clock_is_perf_counter_on_cpu():
    before = time.perf_counter()
    read = phase_clock(torch.device("cpu"))
    assert before <= read <= time.perf_counter()


def test_phase_clock_waits_for_cuda_work_first(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    phase_clock(torch.device("cuda", 0))
    assert waited == [torch.device("cuda", 0)]
    phase_clock(torch.device("cpu"))
    assert len(waited) == 1
