"""FSDP for the student (`fsdp: true`): torch's `fully_shard` (FSDP2), applied by distill itself.

Each decoder layer is one FSDP unit and the wrapper `StudentObjective` (embeddings, final norm, lm_head and the
loss) is the root, so parameters, gradients and AdamW's state live as 1/N shards (DTensors) on each of the N
processes. Why not accelerate's FSDP plugin: on a CPU (gloo) group accelerate 1.x accepts the plugin and
silently wraps the model in DDP instead; applying `fully_shard` here gives one code path on CPU and GPU alike,
the one the tests run.

- Training: the root gathers the lm_head weight once per micro-batch in its forward (the root is not resharded
  after forward, so backward reuses it) and the chunked loss runs inside that forward on the hidden states.
  Gradients are reduce-scattered and averaged over processes like DDP's, so the trainer's loss scale holds.
- Generation and evaluation (`gathered`): every process all-gathers every unit once, then decodes with no
  collective at all (processes stop at different lengths; evaluation runs on the main process only), then
  reshards. The full parameters are held for that time.
- Checkpoints (`save_sharded` / `load_sharded`): torch.distributed.checkpoint writes each process's shards
  of the weights and of the optimizer state into one directory (a filesystem every process sees); the final
  model is gathered to the main process once (`full_state_dict`) for `save_pretrained`.
- The teacher is not sharded: it is frozen (no gradients, no optimizer state), and each process holds a full
  replica of it (docs/scaling.md states its memory).
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

logger = logging.getLogger(__name__)

SHARDED = "sharded"  # the checkpoint's directory of DCP shards
# What a DCP metadata file may name, exactly: the metadata dataclasses and the plain torch values they hold.
# The file is a pickle; it is read with an unpickler that refuses any other name (dotted names included, which
# pickle would otherwise resolve through a module's attributes), so a resume never runs code hidden in it.
_METADATA_CLASSES = {("torch.distributed.checkpoint.metadata", name) for name in (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")}
_METADATA_GLOBALS = _METADATA_CLASSES | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
    ("torch", "Size"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),
    *(("torch", dtype) for dtype in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8",
                                     "uint8", "bool"))}


def decoder_layers(student: nn.Module) -> list[nn.Module]:
    """The student's repeated blocks: the module classes transformers names in `_no_split_modules`."""
    names = set(getattr(student, "_no_split_modules", None) or ())
    layers = [m for m in student.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"fsdp: cannot find the decoder layers of {type(student).__name__} (no module of the classes "
                         f"its _no_split_modules names: {sorted(names)}); train it without fsdp")
    return layers


def shard(root: nn.Module, student: nn.Module) -> nn.Module:
    """`fully_shard` each decoder layer of `student`, then `root` (which holds `student`); in place, returns root.

    Layers reshard after their forward (gathered again for backward); the root does not, so the lm_head it holds
    is gathered once per micro-batch. Needs an initialised process group (accelerate's)."""
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(student):
        fully_shard(layer, reshard_after_forward=True)
    fully_shard(root, reshard_after_forward=False)
    return root


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def gathered(root: nn.Module, run: Callable[[nn.Module], Any]) -> Any:
    """`run(student)` with every parameter gathered; call on every process at the same point.

    All units are all-gathered up front, in the same order on every process, and stay gathered through `run`
    (nothing reshards after a forward meanwhile), so `run` may call the student any number of times, or not at
    all, on each process without a collective. `run` goes through the root's forward so that FSDP meets its root
    first (it decides which module is the root at the first forward it sees)."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in root.modules() if isinstance(m, FSDPModule)]
    root.set_reshard_after_forward(False)
    try:
        for unit in units:
            unit.unshard()
        with torch.no_grad():
            return root(run=run)
    finally:
        root.set_reshard_after_forward(True)
        root.set_reshard_after_forward(False, recurse=False)
        for unit in units:
            unit.reshard()


def clip_grad_norm(root: nn.Module, max_norm: float) -> float:
    """Clip the sharded gradients to `max_norm` in total (all shards, all processes); returns the total norm."""
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_([p for p in root.parameters() if p.grad is not None], max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def full_state_dict(root: nn.Module) -> dict[str, torch.Tensor]:
    """The student's full (unsharded) state dict on the main process, on the CPU; empty elsewhere. Collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    return get_model_state_dict(root, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


OPTIMIZER = "optimizer"  # the DCP key prefix of the optimizer state; absent when it was empty (a step-0 checkpoint)


def save_sharded(directory: Path, root: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Each process writes its shards of the weights and the optimizer state into `directory / SHARDED`.

    `optimizer` is the torch optimizer itself. An optimizer that has not stepped is saved as absent: DCP would
    first run a zero-learning-rate step to create its state, which counts as a step in AdamW's bias correction."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
    )

    if optimizer.state:
        model_state, optimizer_state = get_state_dict(root, optimizer)
        state = {"model": model_state, OPTIMIZER: optimizer_state}
    else:
        state = {"model": get_model_state_dict(root)}
    dcp.save(state, checkpoint_id=str(Path(directory) / SHARDED))


def load_sharded(directory: Path, root: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore the weights and optimizer state `save_sharded` wrote (same number of processes); an optimizer
    saved as absent is left as it is (fresh)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    path = Path(directory) / SHARDED
    check_metadata(path)  # before DCP unpickles it
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    planner = weights_only_load_planner()
    with_optimizer = any(key.startswith(OPTIMIZER + ".") for key in saved)
    if with_optimizer:
        model_state, optimizer_state = get_state_dict(root, optimizer)
        state = {"model": model_state, OPTIMIZER: optimizer_state}
    else:
        state = {"model": get_model_state_dict(root)}
    try:
        dcp.load(state, checkpoint_id=str(path), planner=planner)
    except (Exception, CheckpointException) as error:  # DCP's (a BaseException) gathers every process's failure
        raise ValueError(f"resume: the sharded checkpoint {path} could not be read: it is damaged, or holds objects "
                         f"other than tensors and plain values, which distill never writes (they were not loaded: "
                         f"loading them could run code hidden in them). {type(error).__name__}: "
                         f"{str(error).strip().splitlines()[-1][:300] if str(error).strip() else ''}") from error
    if with_optimizer:
        set_state_dict(root, optimizer, model_state_dict=state["model"], optim_state_dict=state[OPTIMIZER])
    else:
        set_model_state_dict(root, state["model"])


def weights_only_load_planner():
    """DCP's default load planner, except that a non-tensor value (an optimizer's learning rate, betas) is read
    with `torch.load(weights_only=True)`; DCP's own reads it with a full unpickler. (Tensors DCP already reads
    weights-only.) Built on call: torch.distributed.checkpoint is imported only under FSDP."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return WeightsOnlyLoadPlanner()


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


def check_metadata(path: Path) -> None:
    """Refuse a DCP directory whose metadata pickle names anything but DCP's own classes and torch's plain types
    (DCP itself unpickles that file without restriction)."""
    metadata = path / ".metadata"
    if not metadata.is_file():
        raise ValueError(f"resume: {path} holds no .metadata: the sharded checkpoint is incomplete or not distill's")
    try:
        with metadata.open("rb") as file:
            _MetadataUnpickler(file).load()
    except pickle.UnpicklingError as error:
        raise ValueError(f"resume: {metadata} holds objects other than a checkpoint's metadata ({error}); it was not "
                         "loaded (loading it could run code hidden in it). Resume only run directories you trust") from error
    except Exception as error:
        raise ValueError(f"resume: {metadata} is damaged or truncated ({type(error).__name__}: {error})") from error
