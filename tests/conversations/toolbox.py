"""Tools and environments the conversation tests name by import path ('tests.conversations.toolbox:add'): tool
workers import them in a process of their own, so this module imports nothing heavy (a worker starts in a fraction of
a second). The hostile ones misbehave as a careless or unlucky tool would."""

from __future__ import annotations

import asyncio
import os
import re
import resource
import sys
import time
from pathlib import Path


# ------------------------------------------------------------------------------------------ well-behaved tools --
def add(a: int, b: int) -> int:
    """Adds two numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def plus(a: int, b: int) -> int:
    return a + b


def slow(seconds: float = 5.0) -> str:
    time.sleep(seconds)
    return "late"


def broken() -> str:
    raise RuntimeError("disk on fire")


def not_text() -> dict:
    return {"a": 1}


async def async_echo(text: str) -> str:
    await asyncio.sleep(0)
    return text.upper()


_calls = 0


def count() -> int:
    """How many times this worker process has run this tool: module state lives per worker."""
    global _calls
    _calls += 1
    return _calls


def pid() -> int:
    """The process the tool runs in."""
    return os.getpid()


# ----------------------------------------------------------------------------------------------- hostile tools --
def spin() -> str:
    """A pure-Python loop that never ends (it holds the GIL but for the interpreter's switches)."""
    n = 0
    while True:
        n += 1


def backtrack(text: str = "a" * 40 + "!") -> str:
    """Catastrophic backtracking: one call into the regex engine, the GIL held throughout."""
    return str(bool(re.match(r"^(a+)+$", text)))


def hard_exit() -> str:
    os._exit(7)


def soft_exit() -> str:
    sys.exit(3)


def raise_type_error() -> str:
    return len(5)  # type: ignore[arg-type]


def huge() -> str:
    return "x" * (3 << 20)


def hog() -> str:
    """Allocates without bound (address space only: zeroed `bytes` are mapped, never written). Under the worker's limit
    (`tool_memory_gb`); where none is set it sets 2 GiB on its own worker first, so a test cannot take the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, hard))
    blocks = []
    while True:
        blocks.append(bytes(64 << 20))


def segfault() -> str:
    import ctypes

    ctypes.string_at(0)
    return "unreachable"


def killed() -> str:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


MISBEHAVIOURS = {"spin": spin, "regex": backtrack, "os_exit": hard_exit, "sys_exit": soft_exit, "segfault": segfault,
                 "raise": broken, "huge": huge, "hog": hog, "dict": not_text}


def misbehave(how: str) -> str:
    """One tool for every way of failing (a short schema in the prompt): `how` names it; anything else answers "ok"."""
    return MISBEHAVIOURS[how]() if how in MISBEHAVIOURS else "ok"  # type: ignore[operator]


def write_marker(path: str) -> str:
    """Writes a file: a side effect `distill doctor` must not have."""
    Path(path).write_text("a tool ran")
    return "written"


# ------------------------------------------------------------------------------------------------ environments --
class Adder:
    """Adds on request; its reward: whether `plus` was called and the answer was right."""

    def reset(self, **row) -> str:
        self.calls, self.target = 0, int(row["answer"])
        return f" (the numbers are 2 and {self.target - 2})"

    def plus(self, a: int, b: int) -> int:
        self.calls += 1
        return a + b

    def get_reward(self) -> float:
        return float(self.calls > 0)


class AsyncAdder(Adder):
    async def get_reward(self) -> float:
        return 2.0 * float(self.calls > 0)


class BrokenReward(Adder):
    def get_reward(self) -> float:
        raise RuntimeError("the scorer is down")


class NotANumber(Adder):
    def get_reward(self):
        return "good"


class Tally:
    """A stateful environment: a counter per rollout row, started from the row."""

    def __init__(self):
        self.total = None

    def reset(self, **row) -> str:
        self.total = int(row["start"])
        return f" (the tally starts at {self.total})"

    def plus(self, a: int, b: int) -> str:
        self.total += a + b
        return f"tally {self.total}"


class NoReset:
    def plus(self, a: int, b: int) -> int:
        return a + b


class Fragile:
    """A stateful environment whose `step` keeps a count, and whose `crash` ends its worker (os._exit) and `stall`
    holds it past any timeout."""

    def reset(self, **row) -> None:
        self.steps = 0

    def step(self) -> int:
        self.steps += 1
        return self.steps

    def where(self) -> int:
        return os.getpid()

    def crash(self) -> str:
        os._exit(9)

    def stall(self) -> str:
        while True:
            pass

    def leave(self) -> str:
        sys.exit(0)


# --------------------------------------------------------------------------------------------- for the tests --
def tool_worker_pids() -> dict[int, int]:
    """Every tool worker process on this host: pid -> parent pid (read from /proc; a worker runs `python -c` with the
    pool's boot code)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if b"distill.conversations.worker_process import serve" in command:
            found[int(entry.name)] = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
    return found


def orphaned_tool_workers(within: float = 10.0, among: list[int] | None = None) -> dict[int, int]:
    """Orphaned tool workers still there after `within` seconds (a killed trainer's workers end within about a second):
    those of `among` (worker pids) still alive, or without it every worker whose parent is no longer a Python process
    (a worker is reparented when its trainer dies; workers of another run on the host have a live trainer)."""
    deadline = time.time() + within
    while True:
        workers = tool_worker_pids()
        if among is not None:
            left = {pid: workers[pid] for pid in among if pid in workers}
        else:
            left = {pid: parent for pid, parent in workers.items() if parent != os.getpid() and not _is_python(parent)}
        if not left or time.time() > deadline:
            return left
        time.sleep(0.1)


def _is_python(pid: int) -> bool:
    try:
        return b"python" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
