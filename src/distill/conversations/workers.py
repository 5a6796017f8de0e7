"""Tool workers: the processes tools and environments run in, out of the trainer's (`worker_process` is their inside).

Why processes: a thread cannot be stopped, so a tool stuck holding the GIL (a pure-Python loop, a regular expression
backtracking on a model-written argument) would hang the run, and one calling `os._exit` would end it. A process can
be killed: a request past its timeout kills its worker (and what the worker started: each worker leads a process group
of its own), and a fresh one takes the slot when next needed; a worker that dies (`os._exit`, a signal: a segfault,
the kernel's out-of-memory killer) is noticed when its connection closes and told apart by its exit status.

How a worker starts: a fresh interpreter (`python -c`, exec'd by `subprocess`), never a fork: forking a process that
holds torch's thread pools (and CUDA state, and the rollout producer's thread) is unsafe, and multiprocessing's spawn
and forkserver would import the trainer's main module (torch and the models' code) in every worker. The worker is
given the trainer's `sys.path`, so a tool imports in the worker as it does in the trainer; its stdout and stderr are
the trainer's (a tool's print shows as before); its own process group keeps Ctrl-C for the trainer, which finishes the
step and then closes the pool. Each worker starts when a request first needs it and is kept (a warm pool) until
`close` (the run's end), the trainer's exit, or the trainer's death (the worker watches for it).

Slots: `hosts` slots hold environment instances (a request names its host: a row's instance lives in one worker for
its whole conversation), `tools` slots run the run's tools (a call takes any idle one). A slot's incarnation numbers
its processes: a host whose live process is not the one that made an instance has lost it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection, wait
from typing import cast

from distill.conversations.worker_process import Reply

_BOOT = ("import sys\nfrom multiprocessing.connection import Connection\nconnection = Connection(int(sys.argv[1]))\n"
         "path, parent, limit, preload = connection.recv()\nsys.path[:] = path\n"
         "from distill.conversations.worker_process import serve\nserve(connection, parent, limit, preload)\n")
BOOT_SECONDS = 120.0  # a worker imports distill's light leaf and the tools' modules, then says it is ready


@dataclass(frozen=True)
class Job:
    """A request (`worker_process`'s tuples) and where it runs: `host`, a host slot, or None for any tool slot."""

    request: tuple
    host: int | None = None


@dataclass
class _Process:
    popen: subprocess.Popen
    connection: Connection

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL to the worker's process group (what its tools started too), then reap it."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait()
        self.connection.close()

    def death(self, seconds: float) -> Reply:
        """Why the process ended (its connection closed): `exited` with a status, or `crashed` by a signal."""
        try:
            status = self.popen.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # it closed the connection but lives on: end it
            self.kill()
            return Reply("crashed", "closed its connection to the trainer", seconds)
        self.kill()
        if status < 0:
            name = signal.Signals(-status).name if -status in signal.Signals._value2member_map_ else str(-status)
            cause = ", for instance by the out-of-memory killer" if -status == signal.SIGKILL else ""
            return Reply("crashed", f"killed by {name}{cause}", seconds)
        return Reply("exited", f"the process exited with status {status}", seconds)


def _kill_all(processes: list[_Process | None]) -> None:
    for process in processes:
        if process is not None:
            process.kill()


class WorkerPool:
    """`hosts` + `tools` worker slots, each started on first use and kept. `memory_limit`: bytes of address space each
    worker may map (RLIMIT_AS), None for no limit; `preload`: (import path, config field) of what every worker imports
    as it starts, before its first request's clock runs."""

    def __init__(self, hosts: int, tools: int, memory_limit: int | None = None,
                 preload: tuple[tuple[str, str], ...] = ()):
        self.hosts, self.tools, self.memory_limit, self.preload = hosts, tools, memory_limit, preload
        self._processes: list[_Process | None] = [None] * (hosts + tools)
        self._incarnations = [0] * (hosts + tools)  # processes started in each slot
        self._lock = threading.Lock()
        # Workers are started from one thread that lives as long as the pool: Linux's parent-death signal, which ends
        # a worker whose trainer is killed, fires when the thread that started it ends.
        self._launcher: ThreadPoolExecutor | None = None
        self._finalizer = weakref.finalize(self, _kill_all, self._processes)

    def incarnation(self, slot: int) -> int | None:
        """The number of the slot's live process (1 for its first), None when it has none alive."""
        process = self._processes[slot]
        return self._incarnations[slot] if process is not None and process.alive() else None

    def run(self, jobs: list[Job], timeout: float) -> list[Reply]:
        """Every job's reply, in order, with the number of the process that ran it (`Reply.process`). Jobs run at once,
        one at a time per worker (a host's in the order given); each has `timeout` seconds from the moment it starts,
        after which its worker is killed (reply `timeout`)."""
        with self._lock:
            replies: list[Reply | None] = [None] * len(jobs)
            waiting = list(range(len(jobs)))
            busy: dict[int, tuple[int, float]] = {}  # slot -> (job, when it started)
            try:
                while waiting or busy:
                    self._dispatch(jobs, waiting, busy)
                    if not busy:
                        raise ValueError(f"a job no slot of this pool takes: {jobs[waiting[0]]} ({self.tools} tool slots)")
                    self._collect(busy, replies, timeout)
            except BaseException:  # (Ctrl-C twice, a request that cannot be pickled)
                for slot in busy:  # a worker still on a call would answer the next request with this one's reply
                    self._end(slot)
                raise
            return cast(list[Reply], replies)

    def _dispatch(self, jobs: list[Job], waiting: list[int], busy: dict[int, tuple[int, float]]) -> None:
        """Send each waiting job whose slot is free to its worker (started if need be), in order."""
        for job in list(waiting):
            slot = self._free_slot(jobs[job], busy)
            if slot is None:
                continue
            waiting.remove(job)
            process = self._started(slot)
            busy[slot] = (job, time.perf_counter())
            try:
                process.connection.send(jobs[job].request)
            except OSError:  # it died since it was checked: its death is read by `_collect`
                pass

    def _collect(self, busy: dict[int, tuple[int, float]], replies: list[Reply | None], timeout: float) -> None:
        """Wait for a reply or the first deadline; take the replies in, end the workers past their deadline."""
        first_deadline = min(started for _, started in busy.values()) + timeout
        ready = wait([self._live(slot).connection for slot in busy], max(0.0, first_deadline - time.perf_counter()))
        for slot in [slot for slot in busy if self._live(slot).connection in ready]:
            job, started = busy.pop(slot)
            replies[job] = replace(self._reply(slot, time.perf_counter() - started), process=self._incarnations[slot])
        now = time.perf_counter()
        for slot, (job, started) in list(busy.items()):
            if now - started >= timeout:
                del busy[slot]
                self._end(slot)
                replies[job] = Reply("timeout", f"{timeout:g}", now - started, process=self._incarnations[slot])

    def tell(self, host: int, request: tuple) -> None:
        """Send a request that has no reply (dropping instances) to a host's live process; none: nothing to do."""
        with self._lock:
            process = self._processes[host]
            if process is not None and process.alive():
                try:
                    process.connection.send(request)
                except OSError:
                    pass

    def close(self) -> None:
        """End every worker (at the run's end, or when a step fails); the pool starts afresh if used again."""
        with self._lock:
            for slot, process in enumerate(self._processes):
                if process is not None:
                    process.kill()
                    self._processes[slot] = None
            if self._launcher is not None:
                self._launcher.shutdown()
                self._launcher = None

    def pids(self) -> list[int]:
        """The live workers' process ids (what tests check are gone after `close`)."""
        return [process.popen.pid for process in self._processes if process is not None and process.alive()]

    # ------------------------------------------------------------------------------------------ slots --
    def _free_slot(self, job: Job, busy: dict[int, tuple[int, float]]) -> int | None:
        """The slot `job` runs in now: its host when idle; for a tool call an idle started tool slot, else an unstarted
        one; None when it must wait."""
        if job.host is not None:
            return None if job.host in busy else job.host
        idle = [slot for slot in range(self.hosts, self.hosts + self.tools) if slot not in busy]
        started = [slot for slot in idle if self._processes[slot] is not None]
        return (started or idle)[0] if idle else None

    def _live(self, slot: int) -> _Process:
        process = self._processes[slot]
        assert process is not None
        return process

    def _started(self, slot: int) -> _Process:
        """The slot's process, started (again) when it has none or the last one died while idle."""
        process = self._processes[slot]
        if process is not None and process.alive():
            return process
        if process is not None:
            self._end(slot)
        if self._launcher is None:
            self._launcher = ThreadPoolExecutor(1, thread_name_prefix="distill-tool-launcher")
        process = self._launcher.submit(self._start).result()
        self._processes[slot] = process
        self._incarnations[slot] += 1
        return process

    def _start(self) -> _Process:
        """A worker, started and ready (it imported what it preloads)."""
        ours, theirs = _socket_pair()
        popen = subprocess.Popen([sys.executable, "-c", _BOOT, str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        process = _Process(popen, ours)
        ours.send((list(sys.path), os.getpid(), self.memory_limit, list(self.preload)))
        try:
            if ours.poll(BOOT_SECONDS) and ours.recv() == "ready":
                return process
            why = f"it did not say it was ready within {BOOT_SECONDS:g} s"
        except (EOFError, OSError):
            why = process.death(0.0).text or "it ended"
        process.kill()
        raise RuntimeError(f"tools: a tool worker process ({sys.executable}) could not start: {why}; its error, if it "
                           "printed one, is above")

    def _reply(self, slot: int, seconds: float) -> Reply:
        """The reply its worker sent, or (it died) why it died."""
        process = self._live(slot)
        try:
            return process.connection.recv()
        except (EOFError, OSError):
            reply = process.death(seconds)
            self._processes[slot] = None
            return reply

    def _end(self, slot: int) -> None:
        self._live(slot).kill()
        self._processes[slot] = None


def _socket_pair() -> tuple[Connection, Connection]:
    """Two ends of a Unix socket as `multiprocessing` connections (framed, pickled messages)."""
    import socket

    left, right = socket.socketpair()
    return Connection(left.detach()), Connection(right.detach())
