"""Training metrics: sums and counts accumulated over a logging window, reduced across processes once.

Every logged mean is sum(numerators) / sum(denominators) over all micro-batches and processes (float32
all-reduce), never a mean of means. Maxima are all-reduced with MAX, minima with MIN; an extreme no
process saw in the window (still +-inf) is not logged.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Sequence

import torch
import torch.distributed as dist

from distill.batch import by_row
from distill.losses import STAT_NAMES, all_reduce_sum
from distill.objectives.staleness import STALENESS_MAXIMA, STALENESS_METRICS, STALENESS_MINIMA
from distill.training.plan import ASYNC_TIMERS, SOURCES

if TYPE_CHECKING:
    from distill.methods.base import Method

# The reverse KL of a conversation's trained tokens by the model turn they belong to (turn 0 the first), each turn
# from 0 to PER_TURN - 1 on its own and the later ones together: how far the student drifts from the teacher as a
# conversation goes on (the compounding Guided-OPD, TCOD and SOD address). Logged on logging steps, conversations only.
PER_TURN = 8
TURN_KL_NAMES = (*(f"reverse_kl/turn_{k}" for k in range(PER_TURN)), "reverse_kl/later_turns")


class MetricWindow:
    """Named (numerator, denominator) pairs, maxima and plain sums for one logging window."""

    def __init__(self) -> None:
        self.pairs: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.maxima: dict[str, float] = defaultdict(float)
        self.minima: dict[str, float] = defaultdict(lambda: math.inf)
        self.sums: dict[str, float] = defaultdict(float)

    def add_mean(self, name: str, numerator: float, denominator: float) -> None:
        pair = self.pairs[name]
        pair[0] += float(numerator)
        pair[1] += float(denominator)

    def add_max(self, name: str, value: float) -> None:
        self.maxima[name] = max(self.maxima[name], float(value))

    def add_min(self, name: str, value: float) -> None:
        self.minima[name] = min(self.minima[name], float(value))

    def add_sum(self, name: str, value: float) -> None:
        self.sums[name] += float(value)

    def reduce(self, device: torch.device | str = "cpu") -> dict[str, float]:
        """Reduce across processes (tensors on `device`: NCCL cannot reduce CPU tensors). Every process must
        hold the same metric names: the trainer registers every name it may use before the first step."""
        mean_names = sorted(self.pairs)
        sum_names = sorted(self.sums)
        max_names = sorted(self.maxima)
        packed = torch.tensor(
            [v for n in mean_names for v in self.pairs[n]] + [self.sums[n] for n in sum_names], dtype=torch.float64, device=device
        )
        totals = all_reduce_sum(packed).tolist() if packed.numel() else []
        # Minima travel negated, so one MAX all-reduce serves both.
        min_names = sorted(self.minima)
        maxima = torch.tensor([self.maxima[n] for n in max_names] + [-self.minima[n] for n in min_names],
                              dtype=torch.float64, device=device)
        if maxima.numel() and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        result: dict[str, float] = {}
        for i, name in enumerate(mean_names):
            numerator, denominator = totals[2 * i], totals[2 * i + 1]
            if denominator > 0:
                result[name] = numerator / denominator
        offset = 2 * len(mean_names)
        for i, name in enumerate(sum_names):
            result[name] = totals[offset + i]
        extremes = [(name, float(maxima[i])) for i, name in enumerate(max_names)]
        extremes += [(name, -float(maxima[len(max_names) + i])) for i, name in enumerate(min_names)]
        result.update({name: value for name, value in extremes if math.isfinite(value)})
        return result

    def register(self, means: Sequence[str], sums: Sequence[str], maxima: Sequence[str], minima: Sequence[str] = (),
                 signed_maxima: Sequence[str] = ()) -> None:
        """Create entries so every process reduces the same vector even if it never saw some source.
        `maxima` start at 0 (lengths); `signed_maxima` at -inf, so an unseen one is not logged."""
        for name in means:
            self.pairs[name]
        for name in sums:
            self.sums[name]
        for name in maxima:
            self.maxima[name]
        for name in signed_maxima:
            self.maxima[name] = -math.inf
        for name in minima:
            self.minima[name]


def new_window(method: Method | None = None, teacher_ids: Sequence[str] = (), stage_metrics: Sequence[str] = ()) -> MetricWindow:
    """A window with every name the run may log registered (`method`'s own metrics, maxima and minima
    too, and its step stage's), so every process reduces the same vector."""
    window = MetricWindow()
    means = ["loss", "completion_length", "clipped_ratio", "grad_norm", "learning_rate", *STAT_NAMES, *TURN_KL_NAMES,
             *(method.metrics if method is not None else ()), *stage_metrics]
    means += [f"{kind}/{s}" for s in SOURCES for kind in ("loss", "completion_length")]
    means += [f"loss/teacher/{tid}" for tid in teacher_ids if tid]
    # Asynchronous rollouts' (max_staleness > 0): logged only by such a run (a mean nothing added to is not logged).
    means += ["staleness", "staleness/dropped", *STALENESS_METRICS, *(f"time/{name}" for name in ASYNC_TIMERS)]
    window.register(means, ["prompts_truncated", *[f"micro_batches/{s}" for s in SOURCES], "tokens_per_second/generation",
                            "tokens_per_second/teacher", "tokens_per_second/student"],
                    ["completion_length_max", *[f"completion_length/{s}_max" for s in SOURCES]],
                    minima=[*(method.minima if method is not None else ()), *STALENESS_MINIMA],
                    signed_maxima=[*(method.maxima if method is not None else ()), *STALENESS_MAXIMA, "staleness_max"])
    return window


def record_micro_batch(window: MetricWindow, mb, out, log_step: bool, method: Method | None = None,
                       trained_version: int | None = None) -> None:
    """Add one micro-batch's loss sums, lengths and diagnostics (`out`: its DistillLoss) to `window`;
    `method` declares the objective's own metric names. `trained_version`: with asynchronous rollouts, the weights
    version the step trains, for each student sample's staleness (None: not logged)."""
    maxima, minima = (method.maxima, method.minima) if method is not None else ((), ())
    method_metrics = (*(method.metrics if method is not None else ()), *STALENESS_METRICS)
    tokens = int(out.num_tokens)
    loss_sum = float(out.loss_sum.detach())
    window.add_mean("loss", loss_sum, tokens)
    window.add_mean(f"loss/{mb.source}", loss_sum, tokens)
    rows = by_row(mb.completions)  # a conversation in pieces is one row: its pieces' completions together
    lengths = [sum(len(c.completion_ids) for c in row) for row in rows]
    for name in ("completion_length", f"completion_length/{mb.source}"):
        window.add_mean(name, sum(lengths), len(lengths))
        window.add_max(f"{name}_max", max(lengths))
    window.add_mean("clipped_ratio", sum(any(c.hit_max_new_tokens for c in row) for row in rows), len(lengths))
    window.add_sum("prompts_truncated", sum(c.prompt_truncated for c in mb.completions))
    window.add_sum(f"micro_batches/{mb.source}", 1)
    for teacher_id, (group_loss, group_tokens) in (out.groups or {}).items():
        window.add_mean(f"loss/teacher/{teacher_id}", float(group_loss), int(group_tokens))
    for name, (numerator, denominator) in (out.metrics or {}).items():
        if name not in method_metrics:  # an undeclared name would be reduced on some processes only
            raise ValueError(f"the objective reported metric {name!r}, which its method does not declare in Method.metrics")
        window.add_mean(name, float(numerator), float(denominator))
    if trained_version is not None and mb.source == "student":
        staleness = [trained_version - c.weights_version for c in mb.completions if c.weights_version is not None]
        window.add_mean("staleness", sum(staleness), len(staleness))
        window.add_max("staleness_max", max(staleness, default=0))
    for name, value in (out.extrema or {}).items():
        if name in (*maxima, *STALENESS_MAXIMA):
            window.add_max(name, float(value))
        elif name in (*minima, *STALENESS_MINIMA):
            window.add_min(name, float(value))
        else:
            raise ValueError(f"the objective reported extreme {name!r}, which its method does not declare in "
                             "Method.maxima or Method.minima")
    if log_step and out.stats is not None:
        covered = tokens if out.stats_tokens is None else int(out.stats_tokens)
        for name in STAT_NAMES:
            window.add_mean(name, float(getattr(out.stats, name).double().sum()), covered)
        if out.stats_tokens is None:
            add_turn_divergences(window, mb, out.stats.reverse_kl)


def add_turn_divergences(window: MetricWindow, mb, reverse_kl: torch.Tensor) -> None:
    """The reverse KL of `mb`'s conversations (completions with a layout) by model turn (`TURN_KL_NAMES`): `reverse_kl`
    (N,) per trained token of the micro-batch, in row-major order, beside `mb.turns`."""
    if mb.turns is None or not any(c.layout is not None for c in mb.completions):
        return
    conversation = torch.tensor([c.layout is not None for c in mb.completions for _ in range(c.num_trained)], dtype=torch.bool)
    turns = mb.turns.cpu()[conversation]
    values = reverse_kl.detach().cpu().double()[conversation]
    for k, name in enumerate(TURN_KL_NAMES):
        at = turns >= k if k == PER_TURN else turns == k
        if bool(at.any()):
            window.add_mean(name, float(values[at].sum()), int(at.sum()))


def add_throughput(window: MetricWindow, timings: dict[str, float]) -> None:
    """Tokens per second of generation, teacher scoring and the student's step over the window."""
    gen_time = timings.get("generation_student", 0.0) + timings.get("generation_teacher", 0.0)
    gen_tokens = window.pairs["completion_length/student"][0] + window.pairs["completion_length/teacher"][0]
    scored = timings.get("tokens_scored", 0.0)
    if gen_time:
        window.add_sum("tokens_per_second/generation", gen_tokens / gen_time)
    if timings.get("teacher"):
        window.add_sum("tokens_per_second/teacher", scored / timings["teacher"])
    if timings.get("student"):
        window.add_sum("tokens_per_second/student", scored / timings["student"])


def log_record(step: int, epoch: float, reduced: dict[str, float]) -> dict:
    """The metrics.jsonl line of a logging step: sources that never occurred in the window are left out."""
    record = {"step": step, "epoch": epoch}
    record.update({k: v for k, v in reduced.items() if not (k.startswith("micro_batches/") and v == 0)})
    for source in SOURCES:  # a source absent from the window has no maximum length to report
        if reduced.get(f"micro_batches/{source}", 0) == 0:
            record.pop(f"completion_length/{source}_max", None)
    return record


def progress_bar(enabled: bool, max_steps: int, start_step: int):
    """A live progress bar (tqdm) from `start_step` to `max_steps`, or None."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=max_steps, initial=start_step, desc="distill", dynamic_ncols=True)


def show_on_progress_bar(progress, record: dict) -> None:
    """The logged step's loss, KL and student tokens/s beside the bar (when there is one)."""
    if progress is None:
        return
    shown = {"loss": f"{record.get('loss', float('nan')):.3f}"}
    if "forward_kl" in record:  # objectives without per-token diagnostics (gold) have no KL to show
        shown["kl"] = f"{record['forward_kl']:.3f}"
    progress.set_postfix(**shown, tok_s=f"{record.get('tokens_per_second/student', 0):.0f}", refresh=False)
