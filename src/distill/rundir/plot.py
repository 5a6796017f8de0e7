"""PNG curves of a run's metrics.jsonl, one figure per group of related metrics, and a figure of its evaluation
before and after (`eval/eval.json`): the KLs, the answer accuracy, the template leakage and the repetition (the
teacher's beside the student's) it holds."""

from __future__ import annotations

from pathlib import Path

from distill.rundir.metrics_log import read_metrics

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
    evaluation = plot_evaluation(run_dir, plt)
    return written + ([evaluation] if evaluation is not None else [])


COLORS = {"teacher": "#555", "before": "#9aa", "after": "#37a", "student": "#a73"}


def _evaluation_values(metrics: dict) -> dict[str, float]:
    values = {}
    for part, label in (("on_teacher_completions", "teacher's"), ("on_student_completions", "own")):
        for key, name in (("forward_kl", "forward KL"), ("aligned_divergence", "aligned divergence")):
            if key in metrics.get(part, {}):
                values[f"{name}, {label} completions"] = metrics[part][key]
    if "answer_accuracy" in metrics:
        values["answer accuracy"] = metrics["answer_accuracy"]["accuracy"]
    if "template_leakage" in metrics:
        values["template leakage"] = metrics["template_leakage"]["fraction"]
    values |= _repetition_values(metrics)
    return values


def _repetition_values(metrics: dict) -> dict[str, float]:
    values: dict[str, float] = {}
    if "repetition" in metrics:
        values |= {"looping answers (greedy)": metrics["repetition"]["loop_fraction"],
                   "distinct-2 (greedy)": metrics["repetition"]["distinct_2"]}
    if metrics.get("sampled_repetition"):
        values["looping answers (T 1)"] = metrics["sampled_repetition"]["loop_fraction"]
    return values


def plot_evaluation(run_dir: Path, plt) -> Path | None:
    """plots/evaluation.png: one panel per headline number of eval/eval.json, a bar per evaluation (before,
    after); None when the run has no evaluation."""
    import json

    path = run_dir / "eval" / "eval.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    evaluations = {"teacher": _repetition_values(report["teacher"])} if "teacher" in report else {}
    evaluations |= {name: _evaluation_values(m) for name, m in report["metrics"].items()}
    names = list(dict.fromkeys(n for values in evaluations.values() for n in values))
    if not names:
        return None
    figure, axes = plt.subplots(1, len(names), figsize=(2.6 * len(names), 3.2), squeeze=False)
    for axis, name in zip(axes[0], names):
        labels = [label for label, values in evaluations.items() if name in values]
        axis.bar(labels, [evaluations[label][name] for label in labels], color=[COLORS.get(label, "#777") for label in labels])
        axis.set_title(name, fontsize=9)
        axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    target = run_dir / "plots" / "evaluation.png"
    figure.savefig(target, dpi=100)
    plt.close(figure)
    return target
