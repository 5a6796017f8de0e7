"""The model card (README.md) written next to the final student: what it is, how it was made, citations."""

from __future__ import annotations

from pathlib import Path

from distill.version import __version__


def write_model_card(model_dir: Path, config: dict, method, location, num_parameters: int, steps: int,
                     report: dict | None) -> Path:
    """README.md in `model_dir`; `method` (a registered `Method`) gives the paper and the loss line, `location`
    (the run's `distill.locations.TeacherLocation`) the title and where the student started."""
    paper = method.paper
    made_with = (f"the `{config['method']}` method: {paper.title}, {paper.authors}, "
                 f"[arXiv:{paper.arxiv}](https://arxiv.org/abs/{paper.arxiv})." if paper else f"the `{config['method']}` method.")
    lines = [
        "---",
        "library_name: transformers",
        "tags: [distill, knowledge-distillation, " + config["method"] + "]",
        "---",
        "",
        method.card_title(config) or location.card_title(config),
        "",
        f"Trained with distill {__version__} (a knowledge-distillation library; not published on a package index) "
        f"using {made_with}",
        "",
        f"- parameters: {num_parameters:,}",
        f"- student: {config['student'] or location.student_origin} (student_init: {config['student_init'] or 'default'})",
        f"- optimizer steps: {steps}; loss: {method.describe_loss(config)}",
        f"- dataset: {config['dataset']}",
        "",
        "Load it with plain transformers:",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained(PATH)",
        "tokenizer = AutoTokenizer.from_pretrained(PATH)",
        "```",
    ]
    if report is not None and "aligned_divergence" in next(iter(report["metrics"].values()))["on_student_completions"]:
        lines += ["", "## Held-out evaluation", "", "Aligned divergence (ULD across tokenizers), per student token:", "",
                  "| student | teacher completions | own completions |", "| --- | ---: | ---: |"]
        for name, metrics in report["metrics"].items():
            lines.append(f"| {name} | {metrics['on_teacher_completions']['aligned_divergence']:.4f} | "
                         f"{metrics['on_student_completions']['aligned_divergence']:.4f} |")
    elif report is not None:
        lines += ["", "## Held-out evaluation", ""]
        lines += ["| student | forward KL (teacher completions) | reverse KL (own completions) | top-1 agreement |", "| --- | ---: | ---: | ---: |"]
        for name, metrics in report["metrics"].items():
            on_teacher = metrics.get("on_teacher_completions")  # absent for a teacher that only scores
            shown = (f"{on_teacher['forward_kl']:.3f}", f"{on_teacher['top1_agreement']:.3f}") if on_teacher else ("n/a", "n/a")
            lines.append(f"| {name} | {shown[0]} | {metrics['on_student_completions']['reverse_kl']:.3f} | {shown[1]} |")
    if report is not None and any("answer_accuracy" in m for m in report["metrics"].values()):
        lines += ["", "Answer accuracy on the held-out prompts (greedy answer contains the expected answer): " + ", ".join(
            f"{name} {m['answer_accuracy']['accuracy']:.3f}" for name, m in report["metrics"].items() if "answer_accuracy" in m)]
    if paper is not None:
        entry = "article" if paper.venue.startswith("journal=") else "inproceedings"  # a preprint vs a conference paper
        lines += ["", "## Citation", "", "```bibtex", f"@{entry}{{{paper.bibtex_key},", f"  title={{{paper.title}}},",
                  f"  author={{{paper.bibtex_authors}}},", f"  {paper.venue},", f"  eprint={{{paper.arxiv}}}, archivePrefix={{arXiv}}",
                  "}", "```"]
    lines.append("")
    path = Path(model_dir) / "README.md"
    path.write_text("\n".join(lines))
    return path
