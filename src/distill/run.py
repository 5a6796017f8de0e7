"""The run directory: what a run writes, how it is checkpointed, and how it ends.

    config.yaml       the resolved config            checkpoints/step-NNNNNN/   resumable states
    metrics.jsonl     one line per logging step      model/                     the final student + model card
    plots/*.png       curves                         eval/                      before/after report
distill deletes only these, and only when told to (`overwrite_output_dir`), never anything else in the
directory.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import yaml

from distill import checkpoint as ckpt
from distill.config import DistillConfig
from distill.evaluate import Evaluator, build_report, summary_lines, write_report
from distill.metrics import MetricsLog
from distill.model_card import write_model_card
from distill.models import count_parameters

logger = logging.getLogger(__name__)

WRITTEN = ("config.yaml", "metrics.jsonl", ckpt.CHECKPOINTS, "model", "plots", "eval")


def check_output_dir(run_dir: Path, overwrite: bool) -> None:
    """A new run needs an empty (or absent) directory, or `overwrite` to replace a previous run's files."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())) and not overwrite:
        raise ValueError(
            f"output_dir {run_dir} already exists and is not empty: choose another --output_dir, continue it with "
            f"`distill train --resume {run_dir}`, or replace the previous run's files with --overwrite_output_dir true"
        )


def clear_previous_run(run_dir: Path) -> list[Path]:
    """Remove what a previous distill run wrote in `run_dir` (the names in WRITTEN); nothing else. Returns them."""
    removed = []
    for name in WRITTEN:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(path)
    return removed


class RunDirectory:
    """Writes the run directory on the main process; every method here is called on every process."""

    def __init__(self, path: Path, runtime, config, config_record: dict[str, Any]):
        self.path, self.runtime, self.config, self.record = Path(path), runtime, config, config_record
        self._saved_step: int | None = None

    def prepare(self, resuming: bool) -> MetricsLog:
        """Create (or reuse) the directory, record the config; returns the metrics log."""
        accelerator = self.runtime.accelerator
        if accelerator.is_main_process and not resuming:
            if self.path.exists() and self.config.overwrite_output_dir:
                for path in clear_previous_run(self.path):
                    logger.info("overwrite_output_dir: removed %s", path)
            self.path.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (self.path / "config.yaml").write_text(yaml.safe_dump(self.record, sort_keys=False))
        return MetricsLog(self.path / "metrics.jsonl", accelerator.is_main_process)

    # ------------------------------------------------------------------------------------- weights --
    def save_student(self, directory: Path, wrapped, student, tokenizer) -> None:
        """Write the student (save_pretrained) and tokenizer to `directory`; call on every process (FSDP
        gathers the weights collectively)."""
        accelerator = self.runtime.accelerator
        state = accelerator.get_state_dict(wrapped)
        state = {k.removeprefix("student."): v for k, v in state.items()}
        if accelerator.is_main_process:
            student.save_pretrained(directory, state_dict=state, safe_serialization=True)
            tokenizer.save_pretrained(directory)

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
        self.runtime.accelerator.wait_for_everyone()
        return directory

    def save_checkpoint(self, step: int, wrapped, student, tokenizer, optimizer, scheduler, hooks) -> Path:
        """Checkpoint `step` unless this run already wrote it (an interrupt right after a periodic save)."""
        if self._saved_step != step:
            ckpt.save_checkpoint(self.runtime.accelerator, self.path, step,
                                 lambda directory: self.save_student(directory, wrapped, student, tokenizer),
                                 optimizer, scheduler, self.config.save_total_limit, hook_states(hooks))
            self._saved_step = step
        return ckpt.checkpoint_dir(self.path, step)

    def resume(self, student, optimizer, scheduler, hooks) -> int:
        """Restore the latest checkpoint (weights, optimizer, scheduler, RNG, hook states); returns its step."""
        latest = ckpt.latest_checkpoint(self.path)
        if latest is None:
            raise ValueError(f"resume: {self.path} holds no checkpoint to resume from")
        step, states = ckpt.load_training_state(self.runtime.accelerator, latest, student, optimizer, scheduler)
        load_hook_states(hooks, states, latest)
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

    def finish(self, step: int, evaluator: Evaluator | None, before: dict | None, wrapped, student, tokenizer,
               method) -> dict | None:
        """Final model, after-evaluation, report, model card and plots; returns the report's metrics."""
        model_dir = self.save_final_model(wrapped, student, tokenizer)
        report = None
        if evaluator is not None:
            report = build_report(evaluator, {"before": before, "after": evaluator.evaluate(student)})
            write_report(report, self.path / "eval")
        if self.runtime.is_main_process:
            write_model_card(model_dir, self.record, method, count_parameters(student), step, report)
            try:
                from distill.plot import plot_metrics

                plot_metrics(self.path)
            except ImportError:
                logger.warning("matplotlib is not installed: no plots")
            if report is not None:
                print("\n".join(summary_lines(report)))
        self.runtime.accelerator.wait_for_everyone()
        return report["metrics"] if report else None


def hook_states(hooks) -> dict[str, dict]:
    return {hook.name: hook.state_dict() for hook in hooks}


def load_hook_states(hooks, states: dict[str, dict], checkpoint: Path) -> None:
    names = {hook.name for hook in hooks}
    if set(states) != names:
        raise ValueError(f"resume: checkpoint {checkpoint} holds step-hook states {sorted(states)}, this run's method has "
                         f"{sorted(names)}; resume with the method the run was started with")
    for hook in hooks:
        hook.load_state_dict(states[hook.name])


__all__ = ["RunDirectory", "check_output_dir", "clear_previous_run"]


def resume_config(run_dir: Path, overrides: dict[str, Any] | None = None) -> DistillConfig:
    """The config a run was started with (its config.yaml), with `overrides` applied."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"resume: {run_dir} is not a run directory (no config.yaml)")
    values = yaml.safe_load(path.read_text())
    values.pop("num_processes", None)
    values.update(overrides or {})
    values["output_dir"] = str(run_dir)
    return DistillConfig.from_dict(values, where=str(path))
