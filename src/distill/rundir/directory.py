"""The run directory: what a run writes, how it is checkpointed, and how it ends.

    config.yaml       the resolved config            checkpoints/step-NNNNNN/   resumable states
    metrics.jsonl     one line per logging step      model/                     the final student + model card
    plots/*.png       curves                         eval/                      before/after report
    checks.json       the start-of-run checks' findings (`distill.doctor`)
distill deletes only these, and only when told to (`overwrite_output_dir`), never anything else in the
directory; it refuses an output directory that holds any of the run's inputs (models, datasets, cache,
recipe), and one that another live run holds (`run.lock`, see `distill.rundir.lock`).
"""

from __future__ import annotations

import copy
import errno
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from distill.config import DEFAULT_TEACHER, DistillConfig
from distill.config.io import OBJECT_RECORD
from distill.config.origins import COMMAND_LINE, Layer
from distill.data_files import BUNDLED_SETS
from distill.evaluation.evaluator import (
    Evaluator,
    build_report,
    summary_lines,
    write_report,
)
from distill.models import count_parameters, sharding
from distill.models.vision import save_processor
from distill.rundir import checkpoint as ckpt
from distill.rundir.lock import RunLock, check_unlocked
from distill.rundir.metrics_log import MetricsLog
from distill.rundir.model_card import write_model_card

if TYPE_CHECKING:
    from distill.config import DistillConfig
    from distill.locations import TeacherLocation
    from distill.methods.base import Method
    from distill.training.student_access import StudentAccess

logger = logging.getLogger(__name__)

API_NAMES = {"dataset": "train_dataset"}  # Distiller's keyword for a config field, where they differ
WRITTEN = ("config.yaml", "metrics.jsonl", ckpt.CHECKPOINTS, "model", "plots", "eval", "checks.json")


def check_output_dir(run_dir: Path, overwrite: bool, inputs: dict[str, str], resuming: bool = False,
                     break_lock: bool = False) -> None:
    """Before any model loads: the directory can be written, holds none of `inputs` (field -> path), is not
    locked by another run (`distill.rundir.lock`: a stale lock is taken over, another host's only with
    `break_lock`), and (for a new run) is empty or `overwrite` replaces a previous run's files."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"output_dir {run_dir} is a file, not a directory; choose another --output_dir")
    check_writable(run_dir)
    check_inputs_outside(run_dir, inputs)
    if launch_rank() != 0:
        # Another rank would see its own main process's lock and files: in a process group started before the
        # run (torchrun around a user's script), the main process may have written them already.
        return
    check_unlocked(run_dir, break_lock)
    if resuming:
        return
    if overwrite and run_dir.is_dir():
        previous_run_files(run_dir)
    if run_dir.exists() and any(run_dir.iterdir()) and not overwrite:
        raise ValueError(
            f"output_dir {run_dir} already exists and is not empty: choose another --output_dir, continue it with "
            f"`distill train --resume {run_dir}`, or replace the previous run's files with --overwrite_output_dir true"
        )


def launch_rank() -> int:
    """This process's rank in a launch, known before the run's runtime starts (0 for a single process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def run_inputs(config: DistillConfig, location) -> dict[str, str]:
    """The run's inputs named by path in `config` (field -> path), the teacher location's among them
    (`TeacherLocation.inputs`); objects passed from Python are not paths."""
    inputs = {"student": config.student, "dataset": config.dataset, "eval_dataset": config.eval_dataset,
              **location.inputs(config)}
    named = {*BUNDLED_SETS, DEFAULT_TEACHER}  # names distill resolves itself, not paths
    return {field: path for field, path in inputs.items() if isinstance(path, str) and path not in named}


def check_objects_given(config: DistillConfig, given: set[str]) -> None:
    """A resumed run started from Python with objects (config.yaml records only "<Type object>") needs them again."""
    missing = [name for name in ("student", "teacher", "dataset", "eval_dataset")
               if isinstance(getattr(config, name), str) and OBJECT_RECORD.fullmatch(getattr(config, name)) and name not in given]
    if missing:
        raise ValueError(
            f"resume: {config.output_dir} was started from the Python API with objects for {', '.join(missing)} (its "
            f"config.yaml records only their types); pass them again: on the command line as "
            f"{' '.join(f'--{n} PATH' for n in missing)}, or from Python with "
            f"Distiller(config, {', '.join(f'{API_NAMES.get(n, n)}=...' for n in missing)}, resume=True)"
        )


def nearest_existing(path: Path) -> Path:
    """`path`, or the nearest folder above it that exists."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(run_dir: Path) -> None:
    """The directory, or the nearest existing folder above it, accepts new files."""
    existing = nearest_existing(run_dir)
    if not existing.is_dir():
        raise ValueError(f"output_dir {run_dir}: {existing} is a file, so the directory cannot be created; choose another --output_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"output_dir {run_dir}: {existing} is not writable by this user; choose another --output_dir")


def check_inputs_outside(run_dir: Path, inputs: dict[str, str]) -> None:
    """Refuse a run directory that is, or holds, one of the run's inputs: overwriting, checkpoint rotation or
    the final model could otherwise replace what the run reads."""
    root = run_dir.expanduser().resolve()
    for field, spec in inputs.items():
        path = Path(spec).expanduser()
        if not path.exists():
            continue
        path = path.resolve()
        if path == root or root in path.parents:
            raise ValueError(
                f"output_dir {run_dir} holds this run's {field} ({spec}): a run directory must not contain the run's "
                f"inputs; choose an --output_dir outside it (or move the {field} out)"
            )


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_is_full(error: Exception, run_dir: Path) -> bool:
    """A write failed because the run directory's disk is full: ENOSPC / EDQUOT, or (torch.save reports a
    full disk as a RuntimeError) under 1 MiB free there."""
    if isinstance(error, OSError) and error.errno in DISK_FULL:
        return True
    return isinstance(error, (OSError, RuntimeError)) and shutil.disk_usage(nearest_existing(Path(run_dir))).free < 2**20


def disk_full_message(run_dir: Path, error: Exception) -> str:
    """What a run stopped by a full disk tells its user: the intact checkpoint and how to go on."""
    latest = ckpt.latest_checkpoint(run_dir)
    intact = (f"the last intact checkpoint is {latest} (a half-written one is kept under a .tmp- name and never "
              f"resumed from); free space, then continue with `distill train --resume {run_dir}`"
              if latest else "no checkpoint was completed; free space and start the run again")
    reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0]
    where = getattr(error, "filename", None) or "a file"
    return f"the disk holding {run_dir} is full ({reason}, writing {where}): {intact}"


def trim_metrics(path: Path, step: int) -> list[str]:
    """On resume: keep metrics.jsonl's records up to the checkpoint's `step`; drop later records (they will
    be logged again) and torn or unreadable lines (a kill or a full disk mid-write). Returns the dropped
    lines' descriptions. Rewritten atomically."""
    if not path.exists():
        return []
    kept, dropped = [], []
    for number, line in enumerate(path.read_bytes().decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            logged = int(record["step"])
        except (ValueError, KeyError, TypeError):
            dropped.append(f"line {number} (torn or unreadable: {line[:40]!r})")
            continue
        if logged <= step:
            kept.append(line)
        else:
            dropped.append(f"line {number} (step {logged}, after the checkpoint)")
    if dropped:
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text("".join(line + "\n" for line in kept))
        os.replace(temporary, path)
    return dropped


def previous_run_recorded(run_dir: Path) -> bool:
    """`run_dir/config.yaml` is a distill run's record (a mapping with `method` and `num_processes`)."""
    try:
        record = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return False
    return isinstance(record, dict) and "method" in record and "num_processes" in record


def previous_run_files(run_dir: Path) -> list[Path]:
    """The names in WRITTEN present in `run_dir`, if its config.yaml records a distill run; a `model/` or
    `eval/` without that record is the user's, and the run refuses to write over it."""
    present = [run_dir / name for name in WRITTEN if (run_dir / name).exists() or (run_dir / name).is_symlink()]
    if present and not previous_run_recorded(run_dir):
        raise ValueError(
            f"output_dir {run_dir} holds {', '.join(p.name for p in present)} but no distill run's config.yaml, so they "
            "are not a previous run's: overwrite_output_dir replaces only what distill wrote. Move them or choose "
            "another --output_dir"
        )
    return present


def clear_previous_run(run_dir: Path) -> list[Path]:
    """Remove what a previous distill run wrote in `run_dir` (`previous_run_files`); nothing else. Returns them."""
    removed = []
    for path in previous_run_files(run_dir):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        removed.append(path)
    return removed


@dataclass(frozen=True)
class TrainedStudent:
    """What the run directory saves, restores and evaluates. wrapped: the student's objective as accelerate or FSDP
    wrapped it; access: the student as it is now (`access.current()` the module; `access(run)` runs `run(student)` on
    every process, gathered under FSDP); tokenizer: the student's; optimizer, scheduler: the training's; hooks: the
    step hooks whose states a checkpoint holds (`name`, `state_dict`, `load_state_dict`)."""

    wrapped: Any
    access: StudentAccess
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    hooks: list

    @property
    def student(self) -> Any:
        return self.access.current()


@dataclass(frozen=True)
class RunIdentity:
    """What the run is, for the model card: its method (the paper, the loss line) and its teacher's location (the
    title, where the student started)."""

    method: Method
    location: TeacherLocation


class RunDirectory:
    """Writes the run directory on the main process; every method here is called on every process."""

    def __init__(self, path: Path, runtime, config: DistillConfig, config_record: dict[str, Any], identity: RunIdentity,
                 break_lock: bool = False):
        self.path, self.runtime, self.config, self.record = Path(path), runtime, config, config_record
        self.identity = identity
        self.break_lock = break_lock  # take over a lock another host left (`distill.rundir.lock`)
        self._saved_step: int | None = None
        self.lock: RunLock | None = None

    def prepare(self, resuming: bool) -> MetricsLog:
        """Lock the directory, create (or reuse) it, record the config; returns the metrics log."""
        accelerator = self.runtime.accelerator
        error = None
        if accelerator.is_main_process:
            try:  # any failure must reach the agreement below, or the other processes would wait forever
                self.lock = RunLock(self.path).acquire(self.break_lock)
                if not resuming:
                    if self.config.overwrite_output_dir:
                        for path in clear_previous_run(self.path):
                            logger.info("overwrite_output_dir: removed %s", path)
                    self.path.mkdir(parents=True, exist_ok=True)
            except Exception as caught:
                error = caught
                self.release()
        if self.runtime.agree([error is not None])[0]:
            raise error or ValueError(f"output_dir {self.path}: the main process could not prepare it (see its error)")
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (self.path / "config.yaml").write_text(yaml.safe_dump(self.record, sort_keys=False))
        return MetricsLog(self.path / "metrics.jsonl", accelerator.is_main_process)

    # ------------------------------------------------------------------------------------- weights --
    def save_student(self, directory: Path, wrapped, student, tokenizer) -> None:
        """Write the student (save_pretrained) and tokenizer to `directory`; call on every process (FSDP
        gathers the weights collectively)."""
        accelerator = self.runtime.accelerator
        state = sharding.full_state_dict(wrapped) if self.config.fsdp else accelerator.get_state_dict(wrapped)
        state = {k.removeprefix("student."): v for k, v in state.items()}
        if accelerator.is_main_process:
            student.save_pretrained(directory, state_dict=state, safe_serialization=True)
            tokenizer.save_pretrained(directory)
            save_processor(student, directory)

    def save_final_model(self, wrapped, student, tokenizer) -> Path:
        """The final student for plain transformers: LoRA adapters are merged into a copy of the weights."""
        directory = self.path / "model"
        if not self.config.use_peft:
            self.save_student(directory, wrapped, student, tokenizer)
            return directory
        if self.runtime.is_main_process:
            merged = copy.deepcopy(student).merge_and_unload()
            merged.save_pretrained(directory, safe_serialization=True)
            tokenizer.save_pretrained(directory)
            save_processor(student, directory)
        self.runtime.accelerator.wait_for_everyone()
        return directory

    def save_checkpoint(self, step: int, trained: TrainedStudent) -> Path:
        """Checkpoint `step` unless this run already wrote it (an interrupt right after a periodic save)."""
        wrapped, student, tokenizer, optimizer = trained.wrapped, trained.student, trained.tokenizer, trained.optimizer
        if self._saved_step != step:
            if self.config.fsdp:
                save_weights = lambda directory: sharding.save_sharded(directory, wrapped, torch_optimizer(optimizer))  # noqa: E731
            else:
                save_weights = lambda directory: ckpt.save_replicated(  # noqa: E731
                    directory, lambda path: self.save_student(path, wrapped, student, tokenizer), optimizer,
                    self.runtime.is_main_process)
            ckpt.save_checkpoint(self.runtime.accelerator, self.path, step, save_weights, trained.scheduler,
                                 self.config.save_total_limit, hook_states(trained.hooks), self.weights_layout)
            self._saved_step = step
        return ckpt.checkpoint_dir(self.path, step)

    def release(self) -> None:
        """Remove this run's lock (main process); called however the run ends."""
        if self.lock is not None:
            self.lock.release()

    @property
    def weights_layout(self) -> str:
        return ckpt.SHARDED if self.config.fsdp else ckpt.REPLICATED

    def resume(self, trained: TrainedStudent) -> int:
        """Restore the latest checkpoint into `trained` (weights, optimizer, scheduler, RNG, hook states) and cut
        metrics.jsonl back to its step; returns the step."""
        wrapped, student, optimizer = trained.wrapped, trained.student, trained.optimizer
        latest = ckpt.latest_checkpoint(self.path)
        if latest is None:
            raise ValueError(f"resume: {self.path} holds no checkpoint to resume from")
        if self.config.fsdp:
            load_weights = lambda checkpoint: sharding.load_sharded(checkpoint, wrapped, torch_optimizer(optimizer))  # noqa: E731
        else:
            load_weights = lambda checkpoint: ckpt.load_replicated(checkpoint, student, optimizer)  # noqa: E731
        step, states = ckpt.load_training_state(self.runtime.accelerator, latest, load_weights, trained.scheduler,
                                                self.weights_layout)
        load_hook_states(trained.hooks, states, latest)
        if self.runtime.is_main_process:
            dropped = trim_metrics(self.path / "metrics.jsonl", step)
            if dropped:
                logger.warning("resume: metrics.jsonl cut back to checkpoint step %d; dropped %s", step, "; ".join(dropped))
        logger.info("resumed from %s (step %d)", latest, step)
        return step

    # ---------------------------------------------------------------------------------- evaluation --
    def evaluate_before(self, evaluator: Evaluator | None, student) -> dict | None:
        """The "before" evaluation, kept on disk so that a resumed run reports the same one."""
        path = self.path / "eval" / "before.json"
        result = None
        if evaluator is not None:
            if path.exists():
                result = json.loads(path.read_text())
            else:
                result = evaluator.evaluate(student)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(result, indent=2, ensure_ascii=False))
        self.runtime.accelerator.wait_for_everyone()
        return result

    def finish(self, step: int, trained: TrainedStudent, evaluator: Evaluator | None, before: dict | None) -> dict | None:
        """Final model, after-evaluation (`before`: the one `evaluate_before` made), report, model card and plots;
        returns the report's metrics."""
        student = trained.student
        model_dir = self.save_final_model(trained.wrapped, student, trained.tokenizer)
        report = None
        after = trained.access(lambda gathered: evaluator.evaluate(gathered) if evaluator is not None else None)
        if evaluator is not None:
            assert before is not None  # `evaluate_before` ran with this evaluator
            report = build_report(evaluator, {"before": before, "after": after})
            write_report(report, self.path / "eval")
        if self.runtime.is_main_process:
            write_model_card(model_dir, self.record, self.identity.method, self.identity.location,
                             count_parameters(student), step, report)
            try:
                from distill.rundir.plot import plot_metrics

                plot_metrics(self.path)
            except ImportError:
                logger.warning("matplotlib is not installed: no plots")
            if report is not None:
                print("\n".join(summary_lines(report)))
        self.runtime.accelerator.wait_for_everyone()
        return report["metrics"] if report else None


def torch_optimizer(optimizer):
    """The torch optimizer inside accelerate's wrapper (whose `step` would go through a loss scaler)."""
    return getattr(optimizer, "optimizer", optimizer)


def hook_states(hooks) -> dict[str, dict]:
    return {hook.name: hook.state_dict() for hook in hooks}


def load_hook_states(hooks, states: dict[str, dict], checkpoint: Path) -> None:
    names = {hook.name for hook in hooks}
    if set(states) != names:
        raise ValueError(f"resume: checkpoint {checkpoint} holds step-hook states {sorted(states)}, this run has "
                         f"{sorted(names)}; resume with the method and num_iterations the run was started with "
                         "('rollout' is the reused rollout of num_iterations > 1)")
    for hook in hooks:
        hook.load_state_dict(states[hook.name])


__all__ = ["RunDirectory", "RunIdentity", "TrainedStudent", "check_output_dir", "clear_previous_run", "trim_metrics"]


def resume_config(run_dir: Path, overrides: dict[str, Any] | None = None) -> DistillConfig:
    """The config a run was started with (its config.yaml), with `overrides` applied."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"resume: {run_dir} is not a run directory (no config.yaml)")
    try:
        values = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        raise ValueError(f"resume: {path} is not readable YAML ({error}); it is the run's recorded config: restore it "
                         f"or start a new run") from error
    if not isinstance(values, dict) or not values:
        raise ValueError(f"resume: {path} is empty or not a mapping of config fields; it is the run's recorded config: "
                         f"restore it, or start a new run with the same fields")
    values.pop("num_processes", None)
    values["output_dir"] = str(run_dir)
    # The recorded config is a base the user took, as a bundled recipe is; the flags given with --resume are theirs.
    return DistillConfig.from_layers([Layer(str(path), values, users=False),
                                      Layer(COMMAND_LINE, {k: v for k, v in (overrides or {}).items() if k != "output_dir"},
                                            flags=True)])
