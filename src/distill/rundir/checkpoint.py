"""Checkpoints written atomically (temporary directory, then one rename) and the resume that reads them.

A checkpoint `checkpoints/step-000050/` holds the student (`save_pretrained`, also LoRA adapters), the
optimizer and scheduler states, every process's RNG state, the method's step-hook states and the step. A
crash while writing leaves a `.tmp-*` directory that is ignored and cleaned up, never a half-written `step-*`.
Under FSDP the student and optimizer are instead each process's shards in `sharded/`
(torch.distributed.checkpoint, `distill.models.sharding`).

Every `.pt` file holds tensors and plain values only and is read with `torch.load(weights_only=True)`:
resuming a run directory someone else wrote never runs code hidden in a pickle. (numpy's RNG state, the
one value that is not plain, is stored as a tensor and ints.) A file that is damaged or holds anything
else stops the resume with a message naming the file. (A sharded checkpoint's `.metadata` pickle is read
with an unpickler that admits only the checkpoint format's own classes.)
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch

CHECKPOINTS = "checkpoints"
PREFIX = "step-"
REPLICATED, SHARDED = "replicated", "sharded"  # state.json's `weights`: how the student and optimizer are stored


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"{PREFIX}{step:06d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and (p / "state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def rng_state() -> dict:
    """This process's RNG states, in types `torch.load(weights_only=True)` reads."""
    legacy = np.random.get_state(legacy=True)
    assert isinstance(legacy, tuple)  # legacy=True: the tuple form
    kind, key, position, has_gauss, gauss = legacy
    numpy_state = {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "position": int(position),
                   "has_gauss": int(has_gauss), "gauss": float(gauss)}
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": numpy_state}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["key"].numpy().astype(np.uint32), numpy_state["position"],
                         numpy_state["has_gauss"], numpy_state["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(accelerator, run_dir: Path, step: int, save_weights, scheduler, keep: int,
                    hooks: dict[str, dict] | None = None, weights: str = REPLICATED) -> Path:
    """Write checkpoint `step` atomically; every process must call it (each saves its RNG state).

    save_weights(directory): writes the student and the optimizer state there; called on every process (the
    `weights` layout: REPLICATED, the main process writes `student/` and `optimizer.pt`; SHARDED, every
    process writes its shards, `distill.models.sharding`).
    """
    final = checkpoint_dir(run_dir, step)
    temporary = final.parent / f".tmp-{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(rng_state(), temporary / f"rng_{accelerator.process_index}.pt")
    save_weights(temporary)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(scheduler.state_dict(), temporary / "scheduler.pt")
        torch.save(hooks or {}, temporary / "hooks.pt")
        (temporary / "state.json").write_text(json.dumps({"step": step, "num_processes": accelerator.num_processes,
                                                          "weights": weights}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(temporary, final)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def save_replicated(directory: Path, save_student, optimizer, is_main_process: bool) -> None:
    """The student (`save_student(directory / "student")`, collective) and the optimizer state, which every
    process holds whole, written by the main process."""
    save_student(directory / "student")
    optimizer_state = optimizer.state_dict()
    if is_main_process:
        torch.save(optimizer_state, directory / "optimizer.pt")


def load_training_state(accelerator, checkpoint: Path, load_weights, scheduler, weights: str = REPLICATED) -> tuple[int, dict[str, dict]]:
    """Restore the weights and optimizer (`load_weights(checkpoint)`), the scheduler and this process's RNG;
    returns the step and the step-hook states (name -> state) for the caller to hand to its hooks."""
    try:
        state = json.loads((checkpoint / "state.json").read_text())
        int(state["step"]), int(state["num_processes"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(damaged(checkpoint, checkpoint / "state.json", error)) from error
    if state["num_processes"] != accelerator.num_processes:
        raise ValueError(
            f"resume: checkpoint {checkpoint} was written by {state['num_processes']} processes, this run has "
            f"{accelerator.num_processes}; resume with the same number of processes"
        )
    written = state.get("weights", REPLICATED)
    if written != weights:
        flag = {SHARDED: "true", REPLICATED: "false"}
        raise ValueError(f"resume: checkpoint {checkpoint} holds {written} weights (fsdp: {flag.get(written, '?')}), this "
                         f"run has fsdp: {flag[weights]}; resume with the fsdp setting the run was started with")
    load_weights(checkpoint)
    restore(checkpoint, "scheduler.pt", scheduler.load_state_dict)
    restore(checkpoint, f"rng_{accelerator.process_index}.pt", set_rng_state)
    hooks = load_plain(checkpoint, "hooks.pt") if (checkpoint / "hooks.pt").is_file() else {}
    return int(state["step"]), hooks


def load_replicated(checkpoint: Path, model, optimizer) -> None:
    """Restore the (unwrapped) student's weights from `student/` and the optimizer from `optimizer.pt`."""
    from safetensors.torch import load_file

    weights = {}
    for file in sorted((checkpoint / "student").glob("*.safetensors")):
        try:
            weights.update(load_file(str(file)))
        except Exception as error:  # safetensors raises its own error types for a truncated or corrupt file
            raise ValueError(damaged(checkpoint, file, error)) from error
    if hasattr(model, "load_adapter") and (checkpoint / "student" / "adapter_config.json").exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
    else:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if unexpected and hasattr(type(model), "from_pretrained"):
            # transformers saves some models under other names than their modules' (a vision-language model's
            # `model.visual.*` as `visual.*`) and maps them back when it loads: load through it.
            saved = type(model).from_pretrained(str(checkpoint / "student"), dtype=next(model.parameters()).dtype)
            missing, unexpected = model.load_state_dict(saved.state_dict(), strict=False)
        tied = {name for name in missing if "lm_head" in name}
        if set(missing) - tied or unexpected:
            raise ValueError(f"resume: checkpoint {checkpoint} does not match the student (missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})")
    restore(checkpoint, "optimizer.pt", optimizer.load_state_dict)


def load_plain(checkpoint: Path, name: str):
    """`torch.load(weights_only=True)` of one checkpoint file: tensors and plain values, never code."""
    path = checkpoint / name
    if not path.is_file():
        raise ValueError(f"resume: checkpoint {checkpoint} has no {name}; {earlier(checkpoint)}")
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as error:
        if "Weights only load failed" in str(error):
            raise ValueError(
                f"resume: {path} holds objects other than tensors and plain values, which distill never writes; it was "
                f"not loaded (loading it could run code hidden in it). Resume only run directories you trust; "
                f"{earlier(checkpoint)}"
            ) from error
        raise ValueError(damaged(checkpoint, path, error)) from error
    except Exception as error:
        raise ValueError(damaged(checkpoint, path, error)) from error


def restore(checkpoint: Path, name: str, load_state) -> None:
    """Hand a checkpoint file's state to `load_state`; a state that does not fit is reported with its file."""
    state = load_plain(checkpoint, name)
    try:
        load_state(state)
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as error:
        raise ValueError(f"resume: {checkpoint / name} does not fit this run ({error}); {earlier(checkpoint)}") from error


def damaged(checkpoint: Path, path: Path, error: Exception) -> str:
    return f"resume: {path} is damaged or truncated ({type(error).__name__}: {error}); {earlier(checkpoint)}"


def earlier(checkpoint: Path) -> str:
    """How to go on without `checkpoint`: the checkpoints before it, if any."""
    others = [p.name for p in list_checkpoints(checkpoint.parent.parent) if p != checkpoint]
    if not others:
        return "no other checkpoint of this run is left: start the run again"
    return (f"move {checkpoint.name} out of {checkpoint.parent} to resume from {others[-1]} "
            f"(checkpoints left: {', '.join(others)})")
