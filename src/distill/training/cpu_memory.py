"""glibc's mmap threshold for a training process on CPU: how much freed memory stays in the process.

glibc serves a request at or above its mmap threshold with a mapping of its own, handed back to the OS on
free (the next such request page-faults its memory in again), and smaller requests from the heap, reused but
kept. By default the threshold starts at 128 KiB and rises, up to 32 MiB, each time a mapped block is freed:
in a training loop nearly every tensor ends up in the heap, which keeps what each phase freed and grows past
what any phase needs. A fixed threshold turns that adjustment off. Measured on the default pair, on-policy,
4 prompts x 64 tokens, 2 cores, fresh processes side by side (`benchmarks/step.py` settings):

| threshold | s/step | peak RSS |
| --- | ---: | ---: |
| glibc's default (rising to 32 MiB) | 4.12-4.34 | 3.69-3.72 GB |
| 1 MiB | 4.29-4.52 | 3.06-3.08 GB |
| 4 MiB (training, `TRAINING_THRESHOLD`) | 3.99-4.00 | 3.19 GB |

Under FSDP the gathered parameters and full-size gradients are allocated and freed once per unit and micro-batch;
there 64 KiB (`FSDP_THRESHOLD`) measured best (`benchmarks/fsdp.py`: peak 2.3 GB per process, 3.43 GB with
glibc's default).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

logger = logging.getLogger(__name__)

TRAINING_THRESHOLD = 4 * 1024 * 1024
FSDP_THRESHOLD = 64 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def set_mmap_threshold(size: int, why: str) -> bool:
    """Fix glibc's mmap threshold at `size` bytes for this process (logged with `why`); False where the C
    library is not glibc or refuses, in which case nothing changed."""
    if "glibc" not in (platform.libc_ver()[0] or ""):
        return False
    try:  # CDLL(None): the symbols already loaded into this process, glibc's among them
        mallopt = getattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallopt", None)
    except OSError:
        mallopt = None
    if mallopt is None or mallopt(_M_MMAP_THRESHOLD, size) != 1:
        return False
    logger.info("%s: glibc's mmap threshold fixed at %d KiB (freed blocks above it go back to the OS)", why, size // 1024)
    return True
