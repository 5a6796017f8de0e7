"""Hostile cases for the run directory: nothing of the user's is deleted, one run writes a directory at a
time, resume survives torn metrics and refuses checkpoints that are damaged or carry code."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time

import datasets
import numpy as np
import pytest
import torch
import yaml

from distill.cli import main
from distill.rundir import checkpoint as ckpt
from distill.rundir.directory import check_output_dir, resume_config, trim_metrics
from distill.rundir.lock import LOCK, RunLocked
from distill.training.trainer import Distiller
from tests.conftest import chat_rows, tiny_lm
from tests.helpers.training import make_config, make_distiller


def models(tokenizer):
    return dict(student=tiny_lm(len(tokenizer), layers=2, seed=2, eos_token_id=tokenizer.eos_token_id),
                teacher=tiny_lm(len(tokenizer), layers=3, seed=1, eos_token_id=tokenizer.eos_token_id))


def resumed(tokenizer, run_dir) -> Distiller:
    """A Distiller resuming `run_dir` (started from Python with objects, so they are passed again)."""
    return Distiller(resume_config(run_dir), tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)),
                     resume=True, **models(tokenizer))


@pytest.fixture(scope="module")
def finished_run(tokenizer, tmp_path_factory):
    """A 3-step run with checkpoints at steps 1, 2 and 3 (kept as a template; tests copy it)."""
    root = tmp_path_factory.mktemp("template")
    make_distiller(tokenizer, root, max_steps=3, save_steps=1, save_total_limit=5).train()
    return root / "run"


@pytest.fixture
def run_copy(finished_run, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(finished_run, target)
    return target


# ------------------------------------------------------------------------------- inputs and deletion --
def test_output_dir_holding_the_student_is_refused_and_nothing_is_deleted(tokenizer, tmp_path, model_dirs):
    project = tmp_path / "project"
    shutil.copytree(model_dirs["student"], project / "student")
    (project / ".git").mkdir()
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    config = make_config(tmp_path, output_dir=str(project), student=str(project / "student"), overwrite_output_dir=True)
    with pytest.raises(ValueError, match=r"holds this run's student .* must not contain the run's inputs"):
        Distiller(config, teacher=models(tokenizer)["teacher"], tokenizer=tokenizer,
                  train_dataset=datasets.Dataset.from_list(chat_rows(16)))
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before


def test_output_dir_that_is_the_student_directory_is_refused(tokenizer, tmp_path, model_dirs):
    student = tmp_path / "student"
    shutil.copytree(model_dirs["student"], student)
    config = make_config(tmp_path, output_dir=str(student), student=str(student), overwrite_output_dir=True)
    with pytest.raises(ValueError, match="holds this run's student"):
        Distiller(config, teacher=models(tokenizer)["teacher"], tokenizer=tokenizer,
                  train_dataset=datasets.Dataset.from_list(chat_rows(16)))
    assert (student / "config.json").is_file()


def test_output_dir_holding_the_dataset_is_refused_even_with_overwrite(tokenizer, tmp_path):
    data = tmp_path / "out" / "data.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(16)))
    config = make_config(tmp_path, output_dir=str(tmp_path / "out"), dataset=str(data), overwrite_output_dir=True)
    with pytest.raises(ValueError, match=r"holds this run's dataset \(.*data.jsonl\)"):
        Distiller(config, tokenizer=tokenizer, **models(tokenizer))
    assert data.is_file()


def test_output_dir_holding_the_eval_dataset_is_refused(tokenizer, tmp_path):
    held = tmp_path / "out" / "held.jsonl"
    held.parent.mkdir()
    held.write_text("".join(json.dumps(row) + "\n" for row in chat_rows(4)))
    config = make_config(tmp_path, output_dir=str(tmp_path / "out"), eval_dataset=str(held), eval_split="train",
                         eval_before_after=True, overwrite_output_dir=True)
    with pytest.raises(ValueError, match="holds this run's eval_dataset"):
        Distiller(config, tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)), **models(tokenizer))


def test_output_dir_holding_a_teacher_cache_is_refused(tmp_path):
    cache = tmp_path / "out" / "cache"
    cache.mkdir(parents=True)
    config = make_config(tmp_path, output_dir=str(tmp_path / "out"), teacher_cache=str(cache), student="s", lmbda=0.0,
                         overwrite_output_dir=True)
    with pytest.raises(ValueError, match="holds this run's teacher_cache"):
        Distiller(config, train_dataset=datasets.Dataset.from_list(chat_rows(16)))


def test_cli_recipe_inside_the_output_dir_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    recipe = out / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"output_dir": str(out), "overwrite_output_dir": True, "max_steps": 1}))
    assert main(["train", str(recipe)]) == 2
    assert "holds this run's recipe" in capsys.readouterr().err
    assert recipe.is_file()


def test_overwrite_removes_only_what_a_run_wrote(run_copy, tokenizer):
    (run_copy / ".git").mkdir()
    (run_copy / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (run_copy / "notes.md").write_text("mine")
    config = make_config(run_copy.parent, output_dir=str(run_copy), overwrite_output_dir=True, max_steps=1)
    Distiller(config, tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)), **models(tokenizer)).train()
    assert (run_copy / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert (run_copy / "notes.md").read_text() == "mine"
    assert [p.name for p in ckpt.list_checkpoints(run_copy)] == ["step-000001"]  # the old run's 2 and 3 are gone
    assert [r["step"] for r in map(json.loads, (run_copy / "metrics.jsonl").read_text().splitlines())] == [1]


def test_overwrite_output_dirs_help_names_what_it_removes():
    """The help (and so the reference and `distill train --help`) lists exactly what is removed, and says the rest stays."""
    from distill.config import DistillConfig
    from distill.rundir.directory import WRITTEN

    text = {f.name: f for f in DistillConfig.config_fields()}["overwrite_output_dir"].metadata["help"]
    assert all(name in text for name in WRITTEN) and "any other file is kept" in text


def test_output_dir_that_is_a_file_is_refused(tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    with pytest.raises(ValueError, match="is a file, not a directory"):
        check_output_dir(target, True, {})


def test_output_dir_below_a_file_is_refused(tmp_path):
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="file.txt is a file, so the directory cannot be created"):
        check_output_dir(tmp_path / "file.txt" / "run", False, {})


def test_output_dir_that_cannot_be_written_is_refused_before_models_load(tmp_path, monkeypatch):
    import distill.rundir.directory

    monkeypatch.setattr(distill.rundir.directory.os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match="is not writable by this user"):
        Distiller(make_config(tmp_path), student="no-such-org/no-such-model",
                  train_dataset=datasets.Dataset.from_list(chat_rows(16)))


# -------------------------------------------------------------------------------------------- lock --
def write_lock(run_dir, **record):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LOCK).write_text(json.dumps(record))


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_resume_of_a_directory_another_live_run_holds_is_refused(run_copy, tokenizer):
    write_lock(run_copy, pid=os.getppid(), host=socket.gethostname(), started=time.time())
    with pytest.raises(RunLocked, match=rf"is locked by another run \(pid {os.getppid()} on host {socket.gethostname()}"):
        resumed(tokenizer, run_copy)
    assert (run_copy / LOCK).is_file()


def test_a_stale_lock_on_this_host_is_taken_over_with_a_notice(run_copy, tokenizer, caplog):
    """A run killed with SIGKILL leaves its lock; its pid is gone, so --resume takes the lock over (a requeued
    job needs no hand), says so in one line, and removes its own lock at the end."""
    pid = dead_pid()
    write_lock(run_copy, pid=pid, host=socket.gethostname(), started=time.time())
    run = resumed(tokenizer, run_copy)
    with caplog.at_level(logging.WARNING, logger="distill.rundir.lock"):
        run.train()
    notices = [r.getMessage() for r in caplog.records if r.name == "distill.rundir.lock"]
    assert len(notices) == 1 and notices[0].startswith(f"run.lock: took over the lock of pid {pid} on host {socket.gethostname()}")
    assert not (run_copy / LOCK).exists()


def test_a_lock_replaced_after_it_was_judged_stale_is_put_back(tmp_path):
    """Two requeued jobs judge the same stale lock: the one that moves it aside second finds the first's new
    lock instead, puts it back untouched and stops."""
    from distill.rundir.lock import RunLock

    write_lock(tmp_path, pid=os.getpid(), host=socket.gethostname(), started=1.0)  # the first job's, live
    live = (tmp_path / LOCK).read_text()
    judged = {"pid": dead_pid(), "host": socket.gethostname(), "started": 0.5}  # what the second job had read
    assert RunLock(tmp_path)._take_over(judged) is False
    assert (tmp_path / LOCK).read_text() == live and sorted(p.name for p in tmp_path.iterdir()) == [LOCK]


def test_a_reused_pid_does_not_keep_a_dead_runs_lock(run_copy, tokenizer):
    """The lock's pid now belongs to a live process that started after the lock's (pid reuse): stale. With the
    holder's own start time recorded, the same pid is a live run and stops this one."""
    alive = os.getppid()
    import psutil

    write_lock(run_copy, pid=alive, host=socket.gethostname(), started=time.time(),
               process_started=psutil.Process(alive).create_time() + 100.0)
    resumed(tokenizer, run_copy).train()
    write_lock(run_copy, pid=alive, host=socket.gethostname(), started=time.time(),
               process_started=psutil.Process(alive).create_time())
    with pytest.raises(RunLocked, match=rf"is locked by another run \(pid {alive} on host"):
        resumed(tokenizer, run_copy)
    assert json.loads((run_copy / LOCK).read_text())["pid"] == alive


def test_a_lock_from_another_host_stops_the_run_unless_broken_on_purpose(run_copy, tokenizer):
    write_lock(run_copy, pid=dead_pid(), host="another-node", started=time.time())
    with pytest.raises(RunLocked, match="on host another-node.*pass --break-lock"):
        check_output_dir(run_copy, True, {})
    with pytest.raises(RunLocked, match="on host another-node"):
        resumed(tokenizer, run_copy)
    assert json.loads((run_copy / LOCK).read_text())["host"] == "another-node"  # never broken silently
    run = Distiller(resume_config(run_copy), tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)),
                    resume=True, break_lock=True, **models(tokenizer))
    run.train()
    assert not (run_copy / LOCK).exists()


def test_a_live_run_on_this_host_is_never_broken_even_on_purpose(run_copy, tokenizer):
    write_lock(run_copy, pid=os.getppid(), host=socket.gethostname(), started=time.time())
    with pytest.raises(RunLocked, match="Wait for it to finish"):
        Distiller(resume_config(run_copy), tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)),
                  resume=True, break_lock=True, **models(tokenizer))


def test_an_unreadable_lock_still_locks(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / LOCK).write_text("{torn")
    with pytest.raises(RunLocked, match="a process whose lock file is unreadable.*--break-lock"):
        check_output_dir(tmp_path / "run", True, {})
    check_output_dir(tmp_path / "run", True, {}, break_lock=True)


def test_the_lock_is_held_while_training_and_removed_after(tokenizer, tmp_path):
    distiller = make_distiller(tokenizer, tmp_path, max_steps=2)
    seen = []
    original = distiller.train_step

    def watching(step, *args, **kwargs):
        seen.append(json.loads((tmp_path / "run" / LOCK).read_text()))
        return original(step, *args, **kwargs)

    distiller.train_step = watching
    distiller.train()
    assert [(r["pid"], r["host"]) for r in seen] == [(os.getpid(), socket.gethostname())] * 2
    assert not (tmp_path / "run" / LOCK).exists()


def test_the_lock_is_removed_when_a_run_fails(tokenizer, tmp_path):
    distiller = make_distiller(tokenizer, tmp_path, max_steps=2)

    def failing(step, *args, **kwargs):
        raise RuntimeError("boom")

    distiller.train_step = failing
    with pytest.raises(RuntimeError, match="boom"):
        distiller.train()
    assert not (tmp_path / "run" / LOCK).exists()


# ------------------------------------------------------------------------------------------ resume --
def test_trim_metrics_drops_torn_and_later_lines_and_says_which(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n\n{"step": 2, "loss": 0.9}\n{"step": 3, "lo\n{"step": 4}\n{"no_step": 1}\n')
    dropped = trim_metrics(path, 2)
    assert path.read_text() == '{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.9}\n'
    assert dropped == ["line 4 (torn or unreadable: '{\"step\": 3, \"lo')", "line 5 (step 4, after the checkpoint)",
                       "line 6 (torn or unreadable: '{\"no_step\": 1}')"]


def test_resume_after_a_torn_metrics_line_logs_each_step_once(run_copy, tokenizer, caplog):
    checkpoint = ckpt.latest_checkpoint(run_copy)
    shutil.rmtree(checkpoint)  # resume from step 2; metrics hold step 3 and a torn line after it
    with (run_copy / "metrics.jsonl").open("ab") as f:
        f.write(b'{"step": 4, "loss": 0.')
    config = resume_config(run_copy, {"max_steps": 4})
    with caplog.at_level("WARNING"):
        Distiller(config, tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)), resume=True,
                  **models(tokenizer)).train()
    steps = [json.loads(line)["step"] for line in (run_copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert "metrics.jsonl cut back to checkpoint step 2" in caplog.text and "torn or unreadable" in caplog.text


class Payload:
    """A pickle that creates a file when loaded: what a hostile checkpoint would hide."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("name", ["rng_0.pt", "optimizer.pt", "scheduler.pt", "hooks.pt"])
def test_a_crafted_pickle_in_a_checkpoint_never_runs(run_copy, tokenizer, tmp_path, name):
    marker = tmp_path / "payload-ran"
    torch.save({"state": Payload(marker)}, ckpt.latest_checkpoint(run_copy) / name)
    distiller = resumed(tokenizer, run_copy)
    with pytest.raises(ValueError, match=rf"{name} holds objects other than tensors and plain values.*not loaded"):
        distiller.train()
    assert not marker.exists()
    assert not (run_copy / LOCK).exists()


def test_a_truncated_optimizer_state_names_the_file_and_the_earlier_checkpoints(run_copy, tokenizer):
    optimizer = ckpt.latest_checkpoint(run_copy) / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    with pytest.raises(ValueError, match=r"optimizer.pt is damaged or truncated .* to resume from step-000002 "
                                         r"\(checkpoints left: step-000001, step-000002\)"):
        resumed(tokenizer, run_copy).train()


def test_a_truncated_checkpoint_student_names_the_file(run_copy, tokenizer):
    weights = ckpt.latest_checkpoint(run_copy) / "student" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"student/model.safetensors is damaged or truncated"):
        resumed(tokenizer, run_copy).train()


def test_a_garbled_state_json_is_named(run_copy, tokenizer):
    (ckpt.latest_checkpoint(run_copy) / "state.json").write_text("{\"step\": ")
    with pytest.raises(ValueError, match=r"state.json is damaged or truncated"):
        resumed(tokenizer, run_copy).train()


def test_an_optimizer_state_of_another_model_does_not_fit(run_copy, tokenizer):
    other = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    torch.save(other.state_dict(), ckpt.latest_checkpoint(run_copy) / "optimizer.pt")
    with pytest.raises(ValueError, match=r"optimizer.pt does not fit this run"):
        resumed(tokenizer, run_copy).train()


def test_rng_states_round_trip_through_weights_only_files(tmp_path):
    torch.manual_seed(3)
    np.random.seed(4)
    import random

    random.seed(5)
    torch.save(ckpt.rng_state(), tmp_path / "rng.pt")
    expected = (torch.rand(3), np.random.rand(3), random.random())
    ckpt.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


@pytest.mark.parametrize("content, message", [("", "is empty or not a mapping"), ("- a\n- b\n", "is empty or not a mapping"),
                                              ("method: [unclosed\n", "is not readable YAML")])
def test_resume_of_a_damaged_config_yaml_names_it(run_copy, content, message):
    (run_copy / "config.yaml").write_text(content)
    with pytest.raises(ValueError, match=rf"config.yaml {message}"):
        resume_config(run_copy)


def test_cli_resume_of_a_run_started_with_objects_asks_for_them(run_copy, capsys):
    assert main(["train", "--resume", str(run_copy)]) == 2
    err = capsys.readouterr().err
    assert "was started from the Python API with objects for student, teacher, dataset" in err
    assert "--student PATH --teacher PATH --dataset PATH" in err and "train_dataset=..." in err


def test_resume_without_a_checkpoint_says_so(tokenizer, tmp_path):
    make_distiller(tokenizer, tmp_path, max_steps=1).train()
    shutil.rmtree(tmp_path / "run" / "checkpoints")
    with pytest.raises(ValueError, match="holds no checkpoint to resume from"):
        resumed(tokenizer, tmp_path / "run").train()


def test_a_full_disk_names_the_intact_checkpoint(tokenizer, tmp_path, monkeypatch):
    real_save = torch.save

    def filling(obj, path, *args, **kwargs):
        if "step-000002" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", filling)
    distiller = make_distiller(tokenizer, tmp_path, max_steps=3, save_steps=1)
    with pytest.raises(OSError, match=r"is full \(No space left on device.*the last intact checkpoint is .*step-000001"):
        distiller.train()
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["step-000001"]
    assert not (tmp_path / "run" / LOCK).exists()


def test_overwrite_refuses_a_model_dir_no_distill_run_recorded(tokenizer, tmp_path):
    out = tmp_path / "project"
    (out / "model").mkdir(parents=True)
    (out / "model" / "weights.bin").write_text("the user's")
    (out / "config.yaml").write_text("learning_rate: 3\n")  # a user's config, not a distill run's record
    config = make_config(tmp_path, output_dir=str(out), overwrite_output_dir=True)
    with pytest.raises(ValueError, match=r"holds config.yaml, model but no distill run's config.yaml"):
        Distiller(config, tokenizer=tokenizer, train_dataset=datasets.Dataset.from_list(chat_rows(16)), **models(tokenizer))
    assert (out / "model" / "weights.bin").read_text() == "the user's"


def test_a_full_disk_reported_by_torch_save_as_a_runtime_error_is_named(tokenizer, tmp_path, monkeypatch):
    import distill.rundir.directory

    real_save = torch.save

    def filling(obj, path, *args, **kwargs):
        if "step-000002" in str(path):
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(ckpt.torch, "save", filling)
    monkeypatch.setattr(distill.rundir.directory.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100, 100, 0))
    distiller = make_distiller(tokenizer, tmp_path, max_steps=3, save_steps=1)
    with pytest.raises(OSError, match=r"is full \(\[enforce fail.*the last intact checkpoint is .*step-000001"):
        distiller.train()


def test_a_lock_that_cannot_be_written_leaves_nothing_behind(tmp_path, monkeypatch):
    import distill.rundir.lock

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(distill.rundir.lock.os, "fdopen", no_space)
    with pytest.raises(OSError, match="No space left"):
        distill.rundir.lock.RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK).exists()


def test_the_lock_of_a_process_that_exited_unreaped_is_stale(tmp_path):
    """A worker that exited (os._exit, a crash) but that its parent has not reaped yet is a zombie: it writes
    nothing, so its lock is stale."""
    from distill.rundir.lock import is_stale, process_start_time

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    import psutil

    while psutil.Process(process.pid).status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
        time.sleep(0.01)
    assert psutil.Process(process.pid).status() == psutil.STATUS_ZOMBIE
    assert process_start_time(process.pid) is None
    assert is_stale({"pid": process.pid, "host": socket.gethostname(), "started": time.time()})
    process.wait()


def test_another_rank_of_a_launch_does_not_check_its_main_process_lock(tmp_path, monkeypatch):
    """Every rank builds a Distiller; only the main process takes the lock, so a rank > 0 that starts late must
    not mistake its own main process's lock for another run's."""
    write_lock(tmp_path / "run", pid=os.getppid(), host=socket.gethostname(), started=time.time())
    monkeypatch.setenv("RANK", "1")
    check_output_dir(tmp_path / "run", True, {}, resuming=True)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RunLocked):
        check_output_dir(tmp_path / "run", True, {}, resuming=True)


def test_only_the_main_process_judges_the_run_directory(tmp_path, monkeypatch):
    """In a process group started before the run (torchrun around a user's script, the tests' own helper), the
    main process may have written config.yaml before another rank checks: that rank must not call the directory
    someone else's run (it once failed test_fsdp at random, under load)."""
    import distill.rundir.directory as directory

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("method: gkd\n")
    monkeypatch.setattr(directory, "launch_rank", lambda: 1)
    directory.check_output_dir(run, overwrite=False, inputs={})
    monkeypatch.setattr(directory, "launch_rank", lambda: 0)
    with pytest.raises(ValueError, match="already exists and is not empty"):
        directory.check_output_dir(run, overwrite=False, inputs={})
