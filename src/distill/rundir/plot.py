"""PNG curves of a run's metrics.jsonl: one figure per group of related metrics."""

from __future__ import annotations

from pathlib import Path

from distill.metrics import read_metrics

GROUPS = {
    "loss": ["loss", "loss/student", "loss/dataset", "loss/teacher"],
    "kl": ["forward_kl", "reverse_kl"],
    "entropy": ["student_entropy", "teacher_entropy"],
    "agreement": ["top1_agreement", "topk_overlap"],
    "completion_length": ["completion_length", "completion_length/student", "completion_length/dataset", "completion_length/teacher"],
    "learning_rate": ["learning_rate"],
    "grad_norm": ["grad_norm"],
    "throughput": ["tokens_per_second/generation", "tokens_per_second/teacher", "tokens_per_second/student"],
}


def plot_metrics(run_dir: str | Path) -> list[Path]:
    """Write plots/<group>.png for every group with data; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"plot: {run_dir} has no metrics.jsonl")
    records = read_metrics(path)
    out_dir = run_dir / "plots"
    out_dir.mkdir(exist_ok=True)
    written = []
    for group, names in GROUPS.items():
        series = {n: [(r["step"], r[n]) for r in records if n in r] for n in names}
        series = {n: points for n, points in series.items() if points}
        if not series:
            continue
        figure, axis = plt.subplots(figsize=(6, 3.5))
        for name, points in series.items():
            steps, values = zip(*points)
            axis.plot(steps, values, marker="." if len(points) < 30 else None, label=name)
        axis.set_xlabel("optimizer step")
        axis.set_title(group.replace("_", " "))
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        figure.tight_layout()
        target = out_dir / f"{group}.png"
        figure.savefig(target, dpi=100)
        plt.close(figure)
        written.append(target)
    return written
