"""Building small Distillers for tests: tiny random Llama models sharing the test tokenizer."""

from __future__ import annotations

import datasets

from distill import DistillConfig
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm

FAST = dict(max_new_tokens=6, max_prompt_length=48, per_device_train_batch_size=2, gradient_accumulation_steps=2,
            max_steps=2, logging_steps=1, save_steps=0, eval_before_after=False, progress_bar=False,
            seq_kd=False, lmbda_schedule="constant", learning_rate=1e-2, warmup_steps=0, warmup_ratio=0.0, lr_scheduler_type="constant", loss_chunk_size=16)


def make_config(tmp_path, **overrides) -> DistillConfig:
    values = {**FAST, "output_dir": str(tmp_path / "run"), **overrides}
    return DistillConfig(**values)


def make_distiller(tokenizer, tmp_path, rows=None, teacher=None, student=None, eval_dataset=None, teacher_tokenizer=None,
                   **overrides) -> Distiller:
    teacher = teacher if teacher is not None else tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id)
    student = student if student is not None else tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id)
    dataset = datasets.Dataset.from_list(rows if rows is not None else chat_rows(16))
    return Distiller(make_config(tmp_path, **overrides), student=student, teacher=teacher, tokenizer=tokenizer,
                     teacher_tokenizer=teacher_tokenizer, train_dataset=dataset, eval_dataset=eval_dataset)


def forbid_model_loading(monkeypatch, message: str = "a model was loaded before the error", resolving: bool = False) -> None:
    """Every place a run loads a model (with `resolving`, also where it checks a model's path) raises instead,
    for tests of errors that must come first."""
    import distill.locations.model
    import distill.training.assembly

    def refuse(*args, **kwargs):
        raise AssertionError(message)

    for module in (distill.training.assembly, distill.locations.model):
        monkeypatch.setattr(module, "load_model", refuse)
        if resolving:
            monkeypatch.setattr(module, "resolve_model_source", refuse)


def kill_at_checkpoint(command: list[str], run_dir, step: int, timeout: float = 300) -> int:
    """Start `command` (a `distill train` writing `run_dir`), SIGKILL it as soon as its checkpoint of `step` is
    complete, and return its pid; fails when the run finished before it could be killed."""
    import signal
    import subprocess
    import time

    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline and process.poll() is None:
        if (run_dir / "checkpoints" / f"step-{step:06d}" / "state.json").exists():
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    return process.pid



def kill_resume_and_compare(command, tmp_path, step: int, module: str = "distill", after_kill=None):
    """Run `command(run_dir)` (a `distill train`) straight, and again SIGKILLed at its checkpoint of `step` and resumed
    with `python -m MODULE train --resume` (`module`: distill, or a test's wrapper of it); assert both end with
    `torch.equal` weights. `after_kill()`: checks between the kill and the resume. Returns (straight dir, killed dir)."""
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = subprocess.run(command(straight), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    kill_at_checkpoint(command(killed), killed, step)
    if after_kill is not None:
        after_kill()
    resumed = subprocess.run([sys.executable, "-m", module, "train", "--resume", str(killed)], capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected = load_file(str(straight / "model" / "model.safetensors"))
    actual = load_file(str(killed / "model" / "model.safetensors"))
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), f"{name} differs after the resume; {logged_difference(straight, killed)}"
    return straight, killed


def logged_difference(straight, killed) -> str:
    """Where two runs' metrics.jsonl first differ (timings aside), to say what a failed resume test went wrong on."""
    import json

    def records(run) -> list[dict]:
        path = run / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    timing = ("time", "seconds", "per_second", "memory", "rss")
    for first, second in zip(records(straight), records(killed)):
        for key in sorted(set(first) | set(second)):
            if not any(word in key for word in timing) and first.get(key) != second.get(key):
                return f"metrics.jsonl first differs at step {first.get('step')}, {key}: {first.get(key)} vs {second.get(key)}"
    return "metrics.jsonl the same (timings aside)"


def holed_mask(length: int, row: int = 0) -> tuple[bool, ...]:
    """A trained mask with holes, as a trajectory's environment turns make: trained, untrained, trained runs."""
    return tuple((k + row) % 4 not in (1, 2) for k in range(length))


def with_holes(micro_batch, pad_id: int):
    """`micro_batch` again with every row's trained mask holed (`holed_mask`); same tokens, same order."""
    import dataclasses

    from distill.batch import collate

    completions = [dataclasses.replace(c, trained_mask=holed_mask(len(c.completion_ids), row), annotations=dict(c.annotations))
                   for row, c in enumerate(micro_batch.completions)]
    return collate(completions, micro_batch.source, pad_id)
