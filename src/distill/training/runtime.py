"""The process's runtime: accelerate's Accelerator, the device, and precision, decided in one place.

Precision: master weights and the loss are float32 always. `dtype` chooses autocast for the student's
forward (bf16 where the device supports it under 'auto', float32 on CPU) and the dtype the frozen teacher
is stored in (the autocast dtype on an accelerator, float32 on CPU).
"""

from __future__ import annotations

import contextlib
import importlib.util
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from distill.training import cpu_memory

if TYPE_CHECKING:
    from accelerate import Accelerator

    from distill.config import DistillConfig

MIXED_PRECISION = {"float32": "no", "bfloat16": "bf16", "float16": "fp16"}
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def phase_clock(device: torch.device) -> float:
    """`time.perf_counter()` once `device` has run the work queued on it. CUDA runs kernels asynchronously, so
    an unsynchronized read charges a phase's kernels to whichever later phase happens to wait for them (the
    per-phase timings and throughputs in the logs); on CPU it is a plain read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@dataclass
class Runtime:
    accelerator: Accelerator
    device: torch.device
    teacher_dtype: torch.dtype

    @property
    def num_processes(self) -> int:
        return self.accelerator.num_processes

    @property
    def process_index(self) -> int:
        return self.accelerator.process_index

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def agree(self, flags: list[bool]) -> list[bool]:
        """Each flag true if it is true on any process (one all-reduce)."""
        values = torch.tensor([float(f) for f in flags], device=self.device)
        if self.num_processes > 1:
            values = self.accelerator.reduce(values, reduction="sum")
        return [bool(v > 0) for v in values.tolist()]

    def gather_objects(self, value) -> list:
        """`value` of every process, in process order (picklable values; one all-gather)."""
        if self.num_processes == 1:
            return [value]
        import torch.distributed as dist

        gathered = [None] * self.num_processes
        dist.all_gather_object(gathered, value)
        return gathered

    def global_sums(self, values: list[int]) -> list[int]:
        """Each integer summed over processes (one all-reduce)."""
        total = torch.tensor(values, dtype=torch.long, device=self.device)
        if self.num_processes > 1:
            total = self.accelerator.reduce(total, reduction="sum")
        return [int(v) for v in total.tolist()]


def trackers_of(report_to: str) -> list[str]:
    return [t.strip() for t in report_to.split(",") if t.strip() and t.strip() != "none"]


def mixed_precision(dtype: str, device_type: str) -> str:
    """accelerate's mixed_precision for the config's `dtype` on `device_type`."""
    if dtype in MIXED_PRECISION:
        return MIXED_PRECISION[dtype]
    if device_type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"


def start_runtime(config: DistillConfig, project_dir: str) -> Runtime:
    """The Accelerator for `config` (device, precision, trackers), checked for what distill cannot run on."""
    from accelerate import Accelerator

    trackers = trackers_of(config.report_to)
    for tracker in trackers:
        modules = {"tensorboard": ("tensorboard", "tensorboardX")}.get(tracker, (tracker,))
        if not any(importlib.util.find_spec(m) for m in modules):
            raise ValueError(f"report_to: {tracker} is not installed; pip install {modules[0]} (or drop it from report_to)")
    device_type = "cuda" if config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available()) else config.device
    no_accelerator = not torch.cuda.is_available() and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available())
    accelerator = Accelerator(
        # On a CPU-only machine accelerate forms a multi-process (gloo) group only when told cpu=True.
        cpu=config.device == "cpu" or (config.device == "auto" and no_accelerator),
        mixed_precision=mixed_precision(config.dtype, device_type),
        log_with=trackers or None,
        project_dir=project_dir,
    )
    if accelerator.distributed_type.value == "DEEPSPEED":
        raise ValueError("DeepSpeed is not supported yet: its engine steps the optimizer on every backward, which "
                         "breaks distill's step-wide loss denominator; use DDP (a plain multi-process launch), or set fsdp: true "
                         "to shard the student")
    if accelerator.distributed_type.value == "FSDP":
        raise ValueError("accelerate's FSDP plugin is not used by distill, which shards the student itself: launch with a "
                         "plain multi-process accelerate config (or torchrun) and set fsdp: true in distill's config")
    if config.fsdp and accelerator.num_processes == 1:
        raise ValueError("fsdp: true shards over several processes, and this run has one: launch it with "
                         "`accelerate launch --num_processes N -m distill train ...` or `torchrun --nproc_per_node N "
                         "-m distill train ...`, or drop fsdp")
    if config.device not in ("auto", "cpu") and accelerator.num_processes > 1:
        raise ValueError("device: with several processes accelerate places each on its own device; leave device 'auto'")
    device = accelerator.device if config.device in ("auto", "cpu") else torch.device(config.device)
    teacher_dtype = TORCH_DTYPES.get(accelerator.mixed_precision, torch.float32) if device.type != "cpu" else torch.float32
    if device.type == "cpu":
        if config.fsdp:
            cpu_memory.set_mmap_threshold(cpu_memory.FSDP_THRESHOLD, "fsdp on CPU")
        else:
            cpu_memory.set_mmap_threshold(cpu_memory.TRAINING_THRESHOLD, "training on CPU")
    return Runtime(accelerator, device, teacher_dtype)


def check_device(spec: str, field: str = "device") -> None:
    """`spec` names a device torch knows and this machine has; raises ValueError naming `field` otherwise."""
    if spec == "auto":
        return
    forms = "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{field} must be {forms}, got {spec!r}") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{field} must be {forms}, got {spec!r} (distill does not run on {device.type})")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{field} {spec!r}: no CUDA device is visible here (torch.cuda.is_available() is False); use "
                         "'auto' or 'cpu'")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{field} {spec!r}: this machine has {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{field} {spec!r}: MPS is not available here; use 'auto' or 'cpu'")


def eval_device(spec: str) -> torch.device:
    """The device of a single-process command (`distill eval`, `cache-teacher`, `serve-teacher`)."""
    check_device(spec)
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


class StopRequest:
    """Ctrl-C (SIGINT) or SIGTERM during training: remembered, acted on at the next step boundary.

    Stopping only between steps keeps a checkpoint consistent (the optimizer state, the weights and the RNG
    all belong to the same completed step) and lets every process stop at the same step. A second Ctrl-C
    falls back to Python's default and interrupts at once.

    A process started with SIGINT ignored (`nohup`, a shell's background job, some schedulers) was told not to
    react to Ctrl-C, so the run leaves SIGINT ignored; SIGTERM (what schedulers and `kill` send) is caught
    either way. The handlers found at the start are restored when the run ends.
    """

    def __init__(self) -> None:
        self.requested = False
        self._catches_interrupt = False

    def _handle(self, signum, frame) -> None:
        self.requested = True
        if self._catches_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        self._catches_interrupt = previous[signal.SIGINT] is not signal.SIG_IGN
        for sig in previous:
            if sig != signal.SIGINT or self._catches_interrupt:
                signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
