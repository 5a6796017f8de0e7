"""The asynchronous producer (`max_staleness` s > 0): the student's samples of step k are drawn while steps k - s ..
k - 1 train.

Pacing. The rollout of step k is sampled by the weights of version max(0, k - s) (the weights after that many
optimizer steps), never by whichever weights happen to be newest: the worker waits for that version rather than
sampling from another. So a sample's staleness is exactly min(k, s), nothing is ever discarded, and with per-row
seeds (`DecodeRequest.seeded_rows`, keyed by the row's place in the step over all processes) a run's samples do not
depend on timing: two runs at the same s give the same metrics, and the samples do not depend on how the step's rows
are split over processes.

The worker. One thread per process samples from a copy of the student (made once at start). After each optimizer
step the trainer copies the weights it trains (all of a full student; only the adapter of a LoRA one) into a
snapshot of the new version, which is all the training thread waits for; the worker loads a snapshot into its copy
when a rollout needs it (and, for an engine with weights of its own, a vLLM server, pushes them there) and samples.
torch releases the GIL in its kernels, so the worker's decoding and the trainer's passes overlap; on a machine with
few cores they share them. The teacher's samples and the dataset's completions, the method's step stage (sdpo's
rewards) and every collective stay on the training thread, in `take`. An engine that keeps its own weights learns
of the copy at start, on every process (colocated vLLM builds a replica for it then, collectively, and samples it
from the worker thread; a vLLM server takes each version pushed from the worker).

Checkpoints. A checkpoint holds the rollouts sampled ahead (the worker's finished samples, plain values) and, for any
the worker could not finish (it failed), the snapshot of the weights they need: on resume they are sampled again from
those weights with the same seeds. So a run killed and resumed trains on exactly the samples an uninterrupted one does.

Faults. Any failure in the worker (a server that died, an engine that raised, and those outside `Exception`:
`SystemExit` from an environment, `asyncio.CancelledError` out of an async reward) fails the step that takes that
rollout as a `StepFailure`: the trainer checkpoints the state from before the step and prints the resume command.
The worker says it has ended whatever ends it (a `finally`), so the training thread waiting for a rollout the worker
will never sample stops with the same failure instead of waiting forever.

Memory. The worker drops a version as soon as it samples from a newer one (later steps sample from that version or
newer ones), so with pacing wait it holds the versions k - s .. k while the trainer waits at step k: at most s + 1
snapshots (`AsyncFields.snapshots_held`, what the doctor's memory estimate counts).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import cast

import torch
from torch import nn

from distill.batch import MicroBatch
from distill.errors import StepFailure
from distill.generation.sample import sample_from_plain, sample_to_plain
from distill.training.async_worker import (
    Failed,
    Sampled,
    Snapshot,
    describe,
    frozen_copy,
    load_snapshot,
    trainable_snapshot,
)
from distill.training.plan import PACINGS
from distill.training.rollout_parts import ComposedRollout, RolloutParts
from distill.training.student_sampler import Metrics


class RolloutProducerError(StepFailure):
    """The asynchronous rollout producer failed to sample a step's rollout."""

    resume_hint = "once the cause is fixed (a generation server: when it is back)"


class AsyncRollout(ComposedRollout):
    """A producer whose student samples are drawn ahead, in a worker thread, within `max_staleness` (module docstring);
    the teacher's and the dataset's, and the method's stage, in `take`. `parts`: built with the first row of this
    process (seeds keyed by the row's place in the step); `engine`: the generation engine when it keeps its own weights
    (pushed by the worker), else None."""

    def __init__(self, parts: RolloutParts, max_staleness: int, engine=None, pacing: str = "wait"):
        if max_staleness < 1 or pacing not in PACINGS:
            raise ValueError(f"AsyncRollout needs max_staleness >= 1 and a pacing in {PACINGS}, got {max_staleness}, {pacing!r}")
        super().__init__(parts)
        self.with_student, self.device = parts.with_student, parts.device
        self.lag, self.engine, self.pacing = max_staleness, engine, pacing
        # How far ahead rollouts are asked for: within the bound when waiting; beyond it when dropping what is too old.
        self.depth = max_staleness if pacing == "wait" else 2 * max_staleness
        self.dropped = 0  # rollouts sampled ahead and dropped as too stale (pacing drop)
        self._copy: nn.Module | None = None
        self._loaded: int | None = None  # the version the copy holds
        self._versions: dict[int, Snapshot] = {}  # published and still needed
        self._jobs: list[int] = []  # steps submitted to the worker, in order
        self._results: dict[int, Sampled | Failed] = {}
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._submitted_until = -1
        self._taken_at: float | None = None  # when the training thread took the last rollout
        self.metrics: dict[str, tuple[float, float]] = {}  # name -> (sum, steps counted): timers, drops
        self._halted = False  # the worker failed a rollout and takes no more
        self._ended = False  # the worker thread has ended, however it ended (set in its `finally`)
        self._died: BaseException | None = None  # what ended it outside a rollout, if anything did

    # ----------------------------------------------------------------------------------- the schedule --
    def version_for(self, step: int) -> int:
        """The weights version that samples `step`'s rollout (pacing wait; dropping, the newest the worker has)."""
        return max(0, step - self.lag)

    def _sampling_version(self, step: int) -> int | None:
        """The version the worker samples `step` from now, or None while it must wait for it (under the lock)."""
        if self.pacing == "drop":
            return max(self._versions) if self._versions else None
        version = self.version_for(step)
        return version if version in self._versions else None

    def _samples(self, step: int) -> bool:
        return 0 <= step < self.settings.max_steps and "student" in self.sources(step)

    # ----------------------------------------------------------------------------------- the trainer side --
    def start(self, step: int) -> None:
        """Copy the student (its weights are version `step`) and start the worker. An engine with its own weights
        serves the student itself until the worker's first rollout (the evaluation before training samples it)."""
        self._copy = self.with_student(lambda student: frozen_copy(student))
        if self.engine is not None:  # both known to it now, on every process (vLLM builds its replicas collectively)
            self.engine.sync_weights(self._copy)
            self.with_student(self.engine.sync_weights)
        with self._condition:
            self._versions.setdefault(step, self._snapshot())
            self._submitted_until = max(self._submitted_until, step - 1)
        self._thread = threading.Thread(target=self._work, name="distill-rollout-ahead", daemon=True)
        self._thread.start()

    def close(self) -> None:
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            if self.engine is not None:  # the evaluation after training samples the student itself
                self.with_student(self.engine.sync_weights)
        super().close()

    def request(self, step: int) -> None:
        with self._condition:
            for later in range(max(step, self._submitted_until + 1), step + self.depth + 1):
                if self._samples(later) and later not in self._results:
                    self._jobs.append(later)
            self._submitted_until = max(self._submitted_until, step + self.depth)
            self._condition.notify_all()

    def take(self, step: int, timings: dict[str, float]) -> list[MicroBatch]:
        parts, first = self.parts, self.generation_step(step)
        if self._thread is None:  # no worker (`distill doctor` timing a step before training): sampled here, in step
            micro_batches = self.sample_here(first, timings)
            parts.stage.run(first, micro_batches, timings)
            return micro_batches
        samples, loop = {}, {}
        if self._samples(first):
            waited = time.perf_counter()
            with self._condition:  # until the rollout is there, or the worker has ended without it
                self._condition.wait_for(lambda: first in self._results or self._ended)
                result = self._results.get(first)
                died = self._died
            self._timer("queue_wait", time.perf_counter() - waited)
            if result is None:
                cause = f": {describe(died)}" if died is not None else " (it was closed)"
                raise RolloutProducerError(f"the rollout producer's worker ended before sampling step {first}'s "
                                           f"rollout{cause}") from died
            if isinstance(result, Failed):
                raise RolloutProducerError(f"the rollout producer failed sampling step {first}'s rollout: "
                                           f"{describe(result.error)}") from result.error
            samples, loop, version = result.samples, result.loop_metrics, result.version
            for name, value in result.timings.items():
                if name == "weight_push":
                    self._timer("weight_push", value)
                else:
                    timings[name] = timings.get(name, 0.0) + value
            self._timer("generation", result.timings.get("generation_student", 0.0))
            too_old = first - version > self.lag
            self._count("staleness/dropped", float(too_old))
            if too_old:  # pacing drop: too old by now; sampled again from the weights it trains
                self.dropped += 1
                loop = {}
                samples, version = parts.student.sample(first, self.with_student, timings, loop), first
        else:
            version = self.version_for(first)
        self.loop_metrics = {**loop}
        micro_batches = parts.assembler.assemble(first, samples, version, timings, self.loop_metrics)
        parts.stage.run(first, micro_batches, timings)
        self._taken_at = time.perf_counter()
        return micro_batches

    def after_optimizer_step(self, step: int) -> None:
        if self._taken_at is not None:
            self._timer("training", time.perf_counter() - self._taken_at)
            self._taken_at = None
        version = step + 1
        with self._condition:
            self._results.pop(step, None)  # the step is done: its rollout is no longer needed for a retry
        later = (self._samples(version + self.lag) if self.pacing == "wait"  # the one rollout that samples from them
                 else any(self._samples(s) for s in range(version, version + self.depth + 1)))
        if later:
            start = time.perf_counter()
            snapshot = self._snapshot()
            with self._condition:
                self._versions[version] = snapshot
                self._condition.notify_all()
            self._timer("weight_push", time.perf_counter() - start)

    def take_producer_metrics(self) -> dict[str, tuple[float, float]]:
        metrics, self.metrics = self.metrics, {}
        return metrics

    def _timer(self, name: str, seconds: float) -> None:
        self._count(f"time/{name}", seconds)

    def _count(self, name: str, value: float) -> None:
        had = self.metrics.get(name, (0.0, 0.0))
        self.metrics[name] = (had[0] + value, had[1] + 1.0)

    def _snapshot(self) -> Snapshot:
        """The trainable weights as they are now, copied (the frozen ones the worker's copy holds already)."""
        return cast(Snapshot, self.with_student(trainable_snapshot))

    # ----------------------------------------------------------------------------------- the worker --
    def _work(self) -> None:
        """The worker thread: rollouts until closed or halted. Whatever ends it, the training thread learns of it."""
        try:
            self._work_until_done()
        except BaseException as error:  # outside a rollout: handed to whichever step waits next
            with self._condition:
                self._died = error
        finally:
            with self._condition:
                self._ended = True
                self._condition.notify_all()

    def _work_until_done(self) -> None:
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None  # beside training's kernels
        while True:
            with self._condition:
                self._condition.wait_for(lambda: self._closing or bool(self._jobs))
                if self._closing:
                    return
                step = self._jobs[0]
                ready = self._condition.wait_for(lambda: self._closing or self._sampling_version(step) is not None)  # noqa: B023
                version = self._sampling_version(step)
                if self._closing or not ready or version is None:
                    return
                snapshot = self._versions[version]
                for old in [v for v in self._versions if v < version]:  # later rollouts sample from this one or newer
                    del self._versions[old]
            result: Sampled | Failed
            try:
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    result = self._sample(step, version, snapshot)
                    if stream is not None:
                        stream.synchronize()
            except BaseException as error:  # any: handed to the training thread, which fails the step
                result = Failed(error)
            with self._condition:
                self._jobs.pop(0)
                self._results[step] = result
                if isinstance(result, Failed):  # what is left waits for a resume (its weights go into the checkpoint)
                    self._halted = True
                self._condition.notify_all()
                if self._halted:
                    return

    def _sample(self, step: int, version: int, snapshot: Snapshot) -> Sampled:
        timings: dict[str, float] = {}
        if self._loaded != version:
            start = time.perf_counter()
            load_snapshot(self._copy, snapshot)
            self._loaded = version
            if self.engine is not None:  # an engine with its own copy (a vLLM server): these weights, pushed now
                self.engine.sync_weights(self._copy)
            timings["weight_push"] = time.perf_counter() - start
        loop: Metrics = {}
        samples = self.parts.student.sample(step, lambda run: run(self._copy), timings, loop,
                                            clock=lambda device: time.perf_counter())
        return Sampled(samples, timings, loop, version)

    # ----------------------------------------------------------------------------------- checkpoints --
    def holds_state(self) -> bool:
        return True

    def restore_point(self) -> dict:
        return {}  # a failed step leaves the rollouts sampled ahead in place (they are dropped only after a step)

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        if "ahead" not in state:
            raise ValueError("resume: the checkpoint was written by a run without max_staleness; resume with the "
                             "max_staleness it was started with")
        if int(state["lag"]) != self.lag or state.get("pacing", "wait") != self.pacing:
            raise ValueError(f"resume: the checkpoint's rollouts were sampled with max_staleness {state['lag']} and "
                             f"staleness_pacing {state.get('pacing', 'wait')}, this run asks for {self.lag} and "
                             f"{self.pacing}; resume with the settings the run was started with")
        with self._condition:
            for step, saved in state["ahead"].items():
                samples = {int(i): [sample_from_plain(row) for row in rows] for i, rows in saved["outputs"].items()}
                self._results[int(step)] = Sampled(samples, {}, {}, int(saved["version"]))
            for version, snapshot in state["versions"].items():
                self._versions[int(version)] = snapshot
            self._submitted_until = int(state["submitted_until"])
            self._jobs.extend(int(step) for step in state["pending"])

    def state_dict(self) -> dict:
        """The rollouts sampled ahead (waited for: the worker finishes what it was given) and, for any it could not
        finish, the steps and the weights they need; the trainer saves this after an optimizer step."""
        with self._condition:
            self._condition.wait_for(lambda: not self._jobs or self._halted or self._ended or self._thread is None)
            done = {step: result for step, result in self._results.items() if isinstance(result, Sampled)}
            pending = sorted([step for step, result in self._results.items() if isinstance(result, Failed)] + self._jobs)
            # Dropping, a pending rollout samples from the newest weights at resume: the checkpoint's own.
            versions = {v: s for v, s in self._versions.items()
                        if self.pacing == "wait" and any(self.version_for(p) == v for p in pending)}
            return {"lag": self.lag, "pacing": self.pacing, "submitted_until": self._submitted_until, "pending": pending,
                    "versions": versions,
                    "ahead": {step: {"version": result.version,
                                     "outputs": {i: [sample_to_plain(sample) for sample in samples]
                                                 for i, samples in result.samples.items()}}
                              for step, result in done.items()}}

