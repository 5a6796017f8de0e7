"""Checkpoints written atomically (temporary directory, then one rename) and the resume that reads them.

A checkpoint `checkpoints/step-000050/` holds the student (`save_pretrained`, also LoRA adapters), the
optimizer and scheduler states, every process's RNG state, the method's step-hook states (`hooks.pt`,
tensors and plain values only, read with weights_only=True) and the step. A crash while writing leaves a
`.tmp-*` directory that is ignored and cleaned up, never a half-written `step-*`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

CHECKPOINTS = "checkpoints"
PREFIX = "step-"


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
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(accelerator, run_dir: Path, step: int, save_student, optimizer, scheduler, keep: int,
                    hooks: dict[str, dict] | None = None) -> Path:
    """Write checkpoint `step` atomically; every process must call it (each saves its RNG state).

    save_student(directory): writes the student and tokenizer there; called on every process (FSDP gathers
    the weights collectively), writing on the main one.
    """
    final = checkpoint_dir(run_dir, step)
    temporary = final.parent / f".tmp-{final.name}"
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)
        temporary.mkdir(parents=True)
    accelerator.wait_for_everyone()
    torch.save(rng_state(), temporary / f"rng_{accelerator.process_index}.pt")
    save_student(temporary / "student")
    optimizer_state = optimizer.state_dict()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(optimizer_state, temporary / "optimizer.pt")
        torch.save(scheduler.state_dict(), temporary / "scheduler.pt")
        torch.save(hooks or {}, temporary / "hooks.pt")
        (temporary / "state.json").write_text(json.dumps({"step": step, "num_processes": accelerator.num_processes}))
        if final.exists():
            shutil.rmtree(final)
        os.replace(temporary, final)
        for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def load_training_state(accelerator, checkpoint: Path, model, optimizer, scheduler) -> tuple[int, dict[str, dict]]:
    """Restore the (unwrapped) student's weights, optimizer, scheduler and this process's RNG; returns the step
    and the step-hook states (name -> state) for the caller to hand to its hooks."""
    from safetensors.torch import load_file

    state = json.loads((checkpoint / "state.json").read_text())
    if state["num_processes"] != accelerator.num_processes:
        raise ValueError(
            f"resume: checkpoint {checkpoint} was written by {state['num_processes']} processes, this run has "
            f"{accelerator.num_processes}; resume with the same number of processes"
        )
    weights = {}
    for file in sorted((checkpoint / "student").glob("*.safetensors")):
        weights.update(load_file(str(file)))
    if hasattr(model, "load_adapter") and (checkpoint / "student" / "adapter_config.json").exists():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, weights)
    else:
        missing, unexpected = model.load_state_dict(weights, strict=False)
        tied = {name for name in missing if "lm_head" in name}
        if set(missing) - tied or unexpected:
            raise ValueError(f"resume: checkpoint {checkpoint} does not match the student (missing {sorted(set(missing) - tied)[:3]}, unexpected {unexpected[:3]})")
    optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=False))
    scheduler.load_state_dict(torch.load(checkpoint / "scheduler.pt", weights_only=False))
    set_rng_state(torch.load(checkpoint / f"rng_{accelerator.process_index}.pt", weights_only=False))
    hooks_file = checkpoint / "hooks.pt"
    hooks = torch.load(hooks_file, weights_only=True) if hooks_file.is_file() else {}
    return int(state["step"]), hooks
