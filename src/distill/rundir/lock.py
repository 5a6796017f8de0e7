"""The run directory's lock: one run writes to a directory at a time.

`run.lock` holds the writer's pid, host, the lock's time and the process's start time. It is created
atomically (O_EXCL) before the run writes anything and removed when the run ends, however it ends. A second
`distill train` on the same directory (a `--resume` while the first still trains, two shells, two nodes)
stops at once with the holder's pid and host.

A lock left by a process that died without removing it (SIGKILL from the OOM killer, a preempted or requeued
job, power loss) is *stale* when it names this host and its pid is gone, or is now another process (the pid
was reused: its start time differs from the one recorded). A stale lock is taken over with a one-line
notice, so a scheduler that requeues `distill train --resume DIR` needs no hand. A lock naming another host
cannot be judged from here (that process may still be writing to a shared file system): it stops the run
unless `break_lock` (`distill train --break-lock`) says its run is known to be gone. A live process on this
host always stops the run.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

LOCK = "run.lock"
START_TIME_TOLERANCE = 1.0  # seconds: psutil's start times are exact to the clock tick


class RunLocked(ValueError):
    """The run directory is locked by another run (or by one this process cannot judge)."""


def lock_path(run_dir: Path) -> Path:
    return Path(run_dir) / LOCK


def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch), or None when there is no such process (or only its
    zombie)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped by its parent: writes nothing
            return None
        return process.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # exists, but its details are not ours to read
        return float("nan")


def holder(run_dir: Path) -> dict | None:
    """The lock's content (pid, host, started, process_started), {} when it is unreadable, None when there is
    no lock."""
    return read_lock(lock_path(run_dir))


def read_lock(path: Path) -> dict | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        found = json.loads(text)
        return found if isinstance(found, dict) else {}
    except ValueError:  # a lock torn by a crash while it was written
        return {}


def is_stale(found: dict) -> bool:
    """The lock names this host, and its process is gone (or its pid now belongs to a later process)."""
    pid = found.get("pid")
    if not isinstance(pid, int) or found.get("host") != socket.gethostname():
        return False
    started = process_start_time(pid)
    if started is None:
        return True
    recorded = found.get("process_started")
    return isinstance(recorded, (int, float)) and abs(started - recorded) > START_TIME_TOLERANCE


def describe(found: dict) -> str:
    pid, host, started = found.get("pid"), found.get("host"), found.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "an unknown time"
    return f"pid {pid} on host {host}, started {when}" if pid is not None else "a process whose lock file is unreadable"


def check_unlocked(run_dir: Path, break_lock: bool = False) -> None:
    """Raise RunLocked unless `run_dir` is unlocked or its lock may be taken over (stale; or from another
    host, or unreadable, with `break_lock`); called before models load."""
    check_lock(run_dir, holder(run_dir), break_lock)


def check_lock(run_dir: Path, found: dict | None, break_lock: bool) -> None:
    if found is None or is_stale(found):
        return
    path = lock_path(run_dir)
    local_and_live = isinstance(found.get("pid"), int) and found.get("host") == socket.gethostname()
    if break_lock and not local_and_live:
        return
    advice = ("Wait for it to finish, stop it (Ctrl-C saves a checkpoint), or choose another --output_dir"
              if local_and_live else
              f"If that run is gone (its node was preempted, its job killed), pass --break-lock (Python: "
              f"Distiller(..., break_lock=True)) to take {path} over; otherwise choose another --output_dir")
    raise RunLocked(f"output_dir {run_dir} is locked by another run ({describe(found)}): two runs writing one directory "
                    f"corrupt its checkpoints and metrics. {advice}")


class RunLock:
    """Held by the main process while a run writes to its directory; `release` removes only its own lock."""

    def __init__(self, run_dir: Path):
        self.path = lock_path(run_dir)
        self.record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                       "process_started": process_start_time(os.getpid())}
        self.held = False

    def acquire(self, break_lock: bool = False) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                break
            except FileExistsError:
                judged = holder(self.path.parent)
                check_lock(self.path.parent, judged, break_lock)  # a live holder raises here
                if attempt or not self._take_over(judged):
                    raise RunLocked(f"output_dir {self.path.parent}: another run took {self.path} while this one "
                                    "started; run again once it has finished") from None
        try:
            with os.fdopen(descriptor, "w") as file:
                file.write(json.dumps(self.record))
        except BaseException:  # a full disk, an interrupt: leave no empty lock behind to block the next run
            self.path.unlink(missing_ok=True)
            raise
        self.held = True
        return self

    def _take_over(self, judged: dict | None) -> bool:
        """Remove the lock `judged` stale (or broken on purpose), unless another process replaced it meanwhile:
        it is moved aside under a name of this process's, read back, and put back if it is not the one judged.
        True when it is gone."""
        aside = self.path.with_name(f".{LOCK}.taken-by-{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:  # its holder released it meanwhile
            return True
        moved = read_lock(aside)
        if moved != judged:  # a new holder's lock: give it back (unless yet another appeared meanwhile)
            try:
                os.link(aside, self.path)
            except FileExistsError:
                pass
            finally:
                aside.unlink(missing_ok=True)
            return False
        aside.unlink()
        logger.warning("run.lock: took over the lock of %s, which is gone", describe(judged or {}))
        return True

    def release(self) -> None:
        if self.held and holder(self.path.parent) == self.record:
            self.path.unlink(missing_ok=True)
        self.held = False

