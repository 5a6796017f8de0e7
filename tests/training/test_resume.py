"""A run killed with SIGKILL and resumed ends with the same weights as an uninterrupted run."""

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.conftest import chat_rows
from tests.helpers.training import kill_at_checkpoint


def _train_command(run_dir, model_dirs, data, *extra):
    return [
        sys.executable, "-m", "distill", "train", "--teacher", str(model_dirs["teacher"]), "--student", str(model_dirs["student"]),
        "--dataset", str(data), "--output_dir", str(run_dir), "--max_steps", "30", "--save_steps", "1", "--save_total_limit", "3",
        "--logging_steps", "1", "--lmbda", "0.5", "--seq_kd", "true", "--lmbda_schedule", "constant",
        "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--max_new_tokens", "6", "--eval_before_after", "false", "--progress_bar", "false", "--learning_rate", "1e-3", *extra,
    ]


def test_killed_and_resumed_run_matches_an_uninterrupted_one(tmp_path, model_dirs):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))

    straight = tmp_path / "straight"
    subprocess.run(_train_command(straight, model_dirs, data), check=True, capture_output=True, timeout=600)

    killed = tmp_path / "killed"
    pid = kill_at_checkpoint(_train_command(killed, model_dirs, data), killed, 3)
    assert not (killed / "model").exists()

    assert json.loads((killed / "run.lock").read_text())["pid"] == pid  # SIGKILL leaves the lock

    # What a scheduler requeueing the job runs, with no hand in between: the stale lock is taken over.
    resumed = subprocess.run([sys.executable, "-m", "distill", "train", "--resume", str(killed)], capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"run.lock: took over the lock of pid {pid} on host" in resumed.stderr
    assert not (killed / "run.lock").exists()
    expected = load_file(str(straight / "model" / "model.safetensors"))
    actual = load_file(str(killed / "model" / "model.safetensors"))
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 31))



def differing_products() -> int:
    """How many of 144 float32 `linear` products of an input at an unaligned offset differ from its aligned copy's."""
    import itertools

    torch.manual_seed(0)
    differ = 0
    for m, k, n in itertools.product([3, 37, 170, 511], [16, 64, 96, 128], [33, 256, 1000]):
        weight = torch.randn(n, k)
        for offset in (1, 3, 8):
            unaligned = torch.randn(m * k + offset)[offset:].view(m, k)
            differ += not torch.equal(torch.nn.functional.linear(unaligned, weight),
                                      torch.nn.functional.linear(unaligned.clone(), weight))
    return differ


def test_matrix_products_do_not_depend_on_their_inputs_memory_alignment():
    """The premise of every comparison of two runs with `torch.equal` on CPU: conftest's MKL_CBWR took effect (it
    must be set before torch loads MKL), in this process and in the `distill` processes tests start. Without it,
    products of inputs at unaligned offsets differ in the last bit for some shapes (24 of these 144 here)."""
    assert differing_products() == 0
    child = subprocess.run([sys.executable, "-c", "from tests.training.test_resume import differing_products; "
                            "print(differing_products())"], capture_output=True, text=True, check=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    assert child.stdout.strip() == "0"
