"""Tool workers (`distill.conversations.workers`): a call runs in a process of its own, a timeout kills that process
whatever the tool does with the GIL, and every way a tool can fail is a reply of its true kind; the pool is warm,
replaces what it lost, and leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from distill.conversations.tools import FAILURES, failure_message
from distill.conversations.worker_process import MAX_RESULT_CHARS
from distill.conversations.workers import Job, WorkerPool
from tests.conversations.toolbox import orphaned_tool_workers, tool_worker_pids

TOOLBOX = "tests.conversations.toolbox"


def call(name: str, **arguments) -> Job:
    return Job(("call", f"{TOOLBOX}:{name}", arguments))


@pytest.fixture
def pool():
    made = WorkerPool(0, 2)
    yield made
    made.close()


@pytest.mark.timeout(60)  # a tool that could hang the pool fails the test here, not the suite
@pytest.mark.parametrize("name, arguments, kind, says", [
    ("spin", {}, "timeout", "took longer than 0.5 s and was stopped"),  # a pure-Python loop
    ("backtrack", {}, "timeout", "took longer than 0.5 s and was stopped"),  # the regex engine, the GIL held
    ("hard_exit", {}, "exited", "exited before returning a result (the process exited with status 7)"),
    ("soft_exit", {}, "exited", "exited before returning a result (sys.exit(3))"),
    ("segfault", {}, "crashed", "crashed before returning a result (killed by SIGSEGV)"),
    ("killed", {}, "crashed", "killed by SIGKILL, for instance by the out-of-memory killer"),
    ("broken", {}, "raised", "raised RuntimeError: disk on fire"),
    ("raise_type_error", {}, "raised", "raised TypeError: object of type 'int' has no len()"),
    ("add", {"a": 1}, "bad_arguments", "cannot take these arguments (add() missing 1 required positional argument"),
    ("not_text", {}, "not_text", "returned dict, not text"),
    ("huge", {}, "too_long", f"returned 3,145,728 characters (at most {MAX_RESULT_CHARS:,}), too long"),
])
def test_every_failure_is_a_reply_of_its_true_kind_and_the_next_call_works(pool, name, arguments, kind, says):
    failed, after = pool.run([call(name, **arguments), call("add", a=2, b=3)], 0.5)
    assert failed.failure == kind and kind in FAILURES
    assert says in failure_message(name, failed.failure, failed.text)
    assert after.failure is None and after.text == "5"  # the run goes on: the other worker, or a fresh one


@pytest.mark.timeout(60)
def test_a_memory_limit_turns_an_unbounded_allocation_into_out_of_memory():
    limited = WorkerPool(0, 1, memory_limit=1 << 30)
    try:
        hog, after = limited.run([call("hog"), call("add", a=1, b=1)], 20.0)
        assert hog.failure == "out_of_memory" and "MemoryError" in hog.text
        assert after.text == "2" and after.process == hog.process  # the worker survived it
    finally:
        limited.close()


@pytest.mark.timeout(60)
def test_a_timeout_kills_the_worker_and_what_it_started(pool):
    """The killed worker's process group goes with it: a tool's own subprocess does not outlive the timeout."""
    (first,) = pool.run([call("pid")], 5.0)
    worker = int(first.text)
    (stalled,) = pool.run([call("spin")], 0.5)
    assert stalled.failure == "timeout" and stalled.process == first.process
    with pytest.raises(ProcessLookupError):
        os.kill(worker, 0)
    (fresh,) = pool.run([call("pid")], 5.0)
    assert int(fresh.text) != worker and fresh.process == first.process + 1


def test_the_pool_is_warm_calls_run_at_once_and_module_state_is_per_worker(pool):
    pids = {int(reply.text) for reply in pool.run([call("pid") for _ in range(6)], 5.0)}
    assert len(pids) == 2 and os.getpid() not in pids  # both workers took calls, none ran in the trainer
    assert set(pool.pids()) == pids
    again = {int(reply.text) for reply in pool.run([call("pid") for _ in range(4)], 5.0)}
    assert again <= pids  # the same processes: started once, kept
    counts = [int(reply.text) for reply in pool.run([call("count") for _ in range(4)], 5.0)]
    assert sorted(counts) != [1, 2, 3, 4] and max(counts) <= 4  # two counters, one per worker, none in the trainer


def test_a_hosts_requests_run_in_order_in_its_one_process():
    hosts = WorkerPool(2, 0)
    try:
        made = hosts.run([Job(("make", key, f"{TOOLBOX}:Fragile", {}), key % 2) for key in range(4)], 5.0)
        assert all(reply.failure is None for reply in made)
        steps = hosts.run([Job(("method", key, "step", {}), key % 2) for key in (0, 0, 2, 1, 0)], 5.0)
        assert [reply.text for reply in steps] == ["1", "2", "1", "1", "3"]  # each instance's own count, in order
        where = hosts.run([Job(("method", key, "where", {}), key % 2) for key in range(4)], 5.0)
        assert where[0].text == where[2].text != where[1].text == where[3].text
    finally:
        hosts.close()
    assert hosts.pids() == []


def test_close_leaves_no_process_and_the_pool_starts_again(pool):
    pool.run([call("pid"), call("pid")], 5.0)
    started = pool.pids()
    assert len(started) == 2 and set(started) <= set(tool_worker_pids())
    pool.close()
    assert pool.pids() == [] and not set(started) & set(tool_worker_pids())
    (reply,) = pool.run([call("add", a=1, b=2)], 5.0)
    assert reply.text == "3"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("tool", ["add", "backtrack"])  # idle, and busy in C code holding the GIL
def test_a_killed_trainers_workers_end_with_it(tmp_path, tool):
    script = tmp_path / "trainer.py"
    script.write_text(
        "import sys, threading\n"
        f"sys.path[:0] = {[os.getcwd(), *[p for p in sys.path if p]]!r}\n"
        "from distill.conversations.workers import Job, WorkerPool\n"
        "pool = WorkerPool(0, 2)\n"
        f"pool.run([Job(('call', '{TOOLBOX}:add', {{'a': 1, 'b': 1}}))] * 2, 30.0)\n"
        "print(' '.join(map(str, pool.pids())), flush=True)\n"
        f"threading.Thread(target=pool.run, args=([Job(('call', '{TOOLBOX}:{tool}', {{}}))], 3600.0)).start()\n"
        "threading.Event().wait()\n")
    trainer = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in trainer.stdout.readline().split()]
        assert len(workers) == 2 and all(tool_worker_pids().get(pid) == trainer.pid for pid in workers)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
    assert not orphaned_tool_workers(within=10.0, among=workers)
