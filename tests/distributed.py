"""Run a function in several CPU processes joined by a gloo process group (for multi-process tests)."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, fn, args, kwargs, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = fn(rank, world_size, *args, **kwargs)
        with open(os.path.join(out_dir, f"{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    except BaseException:
        dist.destroy_process_group()
        raise
    # Every rank has its result on disk. Leave without running C++ static destructors: now and then a gloo
    # or TCPStore thread still joinable at interpreter exit aborts the process ("terminate called without an
    # active exception", SIGABRT), which mp.spawn reports as a failure of a test that passed.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_in_processes(fn, world_size: int = 2, args: tuple = (), kwargs: dict | None = None) -> list:
    """Call fn(rank, world_size, *args, **kwargs) in `world_size` gloo processes; return each rank's result.

    `fn` must be importable (a module-level function) and return something picklable.
    """
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_worker, args=(world_size, _free_port(), fn, args, kwargs or {}, out_dir), nprocs=world_size, join=True)
        results = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, f"{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    return results


def capture_at_optimizer_step(distiller, capture) -> None:
    """Call `capture()` each time `distiller`'s optimizer steps, before its update (a step pre-hook on the torch
    optimizer inside accelerate's wrapper). Replacing `optimizer.step` instead would hide the step from the
    learning-rate schedule, which then warns that it stepped first."""
    torch_optimizer = getattr(distiller.state.optimizer, "optimizer", distiller.state.optimizer)
    torch_optimizer.register_step_pre_hook(lambda optimizer, args, kwargs: capture())


def first_step_gradient(distiller) -> dict:
    """Set up `distiller` and run optimizer step 0, capturing before the update this process's gradient (what
    the update uses) and the step's logged metrics, reduced over processes."""
    distiller.setup()
    captured = {}

    def capture():
        from torch.distributed.tensor import DTensor

        captured.update({n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
                         for n, p in distiller.student_model.named_parameters()
                         if p.grad is not None})  # under FSDP: the full gradient; frozen parameters have none

    capture_at_optimizer_step(distiller, capture)
    window = distiller._new_window()
    distiller.train_step(0, window, {}, log_step=True)
    return {"grads": captured, "metrics": window.reduce()}


def check_split_invariance(step_gradient, tmp_path, metric_keys: tuple[str, ...]) -> tuple[dict, list]:
    """`step_gradient(rank, world_size, tmp, batch, accumulation)` (module level: spawned) on one process with one
    micro-batch of 8 rows and on two processes with two of 2 each: the same gradient, and the same token-weighted
    `metric_keys` in the logged means. Returns (the single process's result, the ranks')."""
    import pytest

    single = step_gradient(0, 1, str(tmp_path / "single"), 8, 1)
    ranks = run_in_processes(step_gradient, world_size=2, args=(str(tmp_path / "multi"), 2, 2))
    for rank in ranks:
        assert_same_gradients(rank["grads"], single["grads"])
    for key in metric_keys:
        assert ranks[0]["metrics"][key] == pytest.approx(single["metrics"][key], rel=1e-5), key
    return single, ranks


def assert_same_gradients(actual: dict, expected: dict) -> None:
    """The same gradient, parameter by parameter, up to float32 rounding: a split over processes and micro-batches
    sums the same terms in another order, so each tensor's error is bounded relative to its largest entry (1e-5;
    measured up to 1e-6), not element by element, where an entry near zero can fail on rounding alone and which
    entry does depends on the processor's kernels. A dropped row or a wrong normaliser moves the gradient by percents."""
    from tests.losses.reference import assert_close_relative

    assert actual.keys() == expected.keys()
    for name, grad in expected.items():
        assert_close_relative(actual[name], grad, 1e-5, name)


def accelerate_launch_distill(arguments: list[str], processes: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    """`accelerate launch ... -m distill ARGUMENTS` on `processes` CPU processes; the finished process.

    accelerate's launcher for several processes is --multi_gpu (its --cpu launches a single process); on a
    machine without GPUs distill puts accelerate in CPU mode, so the processes form a gloo group."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "distill", *arguments]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
