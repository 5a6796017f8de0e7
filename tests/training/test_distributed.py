"""Several processes (gloo, CPU): split invariance of the gradient, token-weighted metrics, accelerate launch."""

import json

import pytest
import torch

from distill.training.metrics import MetricWindow
from tests.conftest import chat_rows, train_tiny_tokenizer
from tests.distributed import (
    accelerate_launch_distill,
    check_split_invariance,
    first_step_gradient,
    run_in_processes,
)
from tests.helpers.training import make_distiller


def _unequal_rows():
    rows = chat_rows(8)
    for i, row in enumerate(rows):
        row["completion"] = " ".join(["word"] * (1 + 3 * i))  # 1 .. 22 words: very unequal lengths
    return rows


def _step_gradient(rank, world_size, tmp, batch, accumulation):
    torch.manual_seed(0)
    tokenizer = train_tiny_tokenizer()
    distiller = make_distiller(tokenizer, tmp_path_for(tmp, rank), rows=_unequal_rows(), lmbda=0.0, max_grad_norm=0.0,
                               per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation, max_new_tokens=40)
    return first_step_gradient(distiller)


def tmp_path_for(tmp, rank):
    from pathlib import Path

    return Path(tmp) / f"rank{rank}"


@pytest.mark.slow
def test_gradient_is_split_invariant_across_processes_and_micro_batches(tmp_path):
    # Logged means are token-weighted over both processes: identical to the single process's.
    _, ranks = check_split_invariance(_step_gradient, tmp_path, ("loss", "forward_kl", "reverse_kl", "completion_length",
                                                                  "grad_norm", "learning_rate"))
    assert ranks[0]["metrics"] == ranks[1]["metrics"]


def _window_on_rank(rank, world_size):
    window = MetricWindow()
    tokens = [3, 40][rank]
    window.add_mean("loss", [10.0, -1.0][rank] * tokens, tokens)
    window.add_max("length_max", [5, 9][rank])
    return window.reduce()


def test_metric_means_are_token_weighted_across_processes():
    first, second = run_in_processes(_window_on_rank, world_size=2)
    assert first == second
    assert first["loss"] == pytest.approx((10.0 * 3 - 1.0 * 40) / 43)
    assert first["length_max"] == 9


@pytest.mark.slow
def test_accelerate_launch_two_cpu_processes(tmp_path, model_dirs):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    run = tmp_path / "run"
    result = accelerate_launch_distill([
        "train", "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]), "--dataset", str(data),
        "--output_dir", str(run), "--max_steps", "2", "--logging_steps", "1", "--lmbda", "0.5",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2", "--max_new_tokens", "6",
        "--eval_before_after", "false", "--progress_bar", "false", "--save_steps", "1",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert json.loads((run / "checkpoints" / "step-000002" / "state.json").read_text())["num_processes"] == 2
    assert (run / "checkpoints" / "step-000001" / "rng_1.pt").is_file()
    assert (run / "model" / "model.safetensors").is_file()
