"""The run directory's lock: one run writes to a directory at a time.

`run.lock` holds the writer's pid, host and start time. It is created atomically (O_EXCL) before the run
writes anything and removed when the run ends, however it ends. A second `distill train` on the same
directory (a `--resume` while the first still trains, two shells, two nodes) stops at once with the
holder's pid and host. A lock left by a process that died without removing it (SIGKILL, power loss) is
detected on the same host and reported with the command that clears it; distill never breaks a lock
itself, since a pid it cannot see (another host, another container) may still be writing.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

LOCK = "run.lock"


class RunLocked(ValueError):
    """The run directory is locked by another run (or by a dead one, reported as stale)."""


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def holder(run_dir: Path) -> dict | None:
    """The lock's content (pid, host, started), {} when it is unreadable, None when there is no lock."""
    path = lock_path(run_dir)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        found = json.loads(text)
        return found if isinstance(found, dict) else {}
    except ValueError:  # a lock torn by a crash while it was written
        return {}


def check_unlocked(run_dir: Path) -> None:
    """Raise RunLocked when `run_dir` is locked (by a live run, or stale); called before models load."""
    found = holder(run_dir)
    if found is None:
        return
    path = lock_path(run_dir)
    pid, host, started = found.get("pid"), found.get("host"), found.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "an unknown time"
    if isinstance(pid, int) and host == socket.gethostname() and not pid_alive(pid):
        raise RunLocked(
            f"output_dir {run_dir} has a stale lock: {path} names pid {pid} on this host ({host}), started {when}, and "
            f"that process is gone (killed or crashed). If no other run uses {run_dir}, remove the lock "
            f"(rm {path}) and run again; with --resume the run continues from its last checkpoint"
        )
    who = f"pid {pid} on host {host}, started {when}" if pid is not None else "a process whose lock file is unreadable"
    raise RunLocked(
        f"output_dir {run_dir} is locked by another run ({who}): two runs writing one directory corrupt its "
        f"checkpoints and metrics. Wait for it to finish, stop it (Ctrl-C saves a checkpoint), or choose another "
        f"--output_dir. If that process is gone, remove {path}"
    )


class RunLock:
    """Held by the main process while a run writes to its directory; `release` removes only its own lock."""

    def __init__(self, run_dir: Path):
        self.path = lock_path(run_dir)
        self.record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        self.held = False

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            check_unlocked(self.path.parent)
            raise RunLocked(f"output_dir {self.path.parent}: another run took {self.path} and released it while this one "
                            "started; run again once it has finished") from None
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(json.dumps(self.record))
        except BaseException:  # a full disk, an interrupt: leave no empty lock behind to block the next run
            self.path.unlink(missing_ok=True)
            raise
        self.held = True
        return self

    def release(self) -> None:
        if self.held and holder(self.path.parent) == self.record:
            self.path.unlink(missing_ok=True)
        self.held = False
