"""The model card (README.md) written next to the final student: what it is, how it was made, citations."""

from __future__ import annotations

from pathlib import Path

PAPERS = {
    "gkd": ("On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes (GKD)", "Agarwal et al., 2024", "2306.13649"),
    "on_policy": ("On-Policy Distillation of Language Models: Learning from Self-Generated Mistakes (GKD)", "Agarwal et al., 2024", "2306.13649"),
}
# A server or cache teacher changes where the teacher's log-probs come from, not the objective (GKD's JSD).
PAPERS["server"] = PAPERS["offline"] = PAPERS["gkd"]


def teacher_description(config: dict) -> str:
    if config.get("teacher_cache"):
        return f"the teacher cache {config['teacher_cache']}"
    if config.get("teacher_url"):
        return f"the teacher server {config['teacher_url']}"
    return str(config["teacher"])


def write_model_card(model_dir: Path, config: dict, num_parameters: int, steps: int, report: dict | None) -> Path:
    title, authors, arxiv = PAPERS[config["method"]]
    lines = [
        "---",
        "library_name: transformers",
        "tags: [distill, knowledge-distillation, " + config["method"] + "]",
        "---",
        "",
        f"# Student distilled from {teacher_description(config)}",
        "",
        f"Trained with [distill](https://pypi.org/project/distill/) using the `{config['method']}` method: "
        f"{title}, {authors}, [arXiv:{arxiv}](https://arxiv.org/abs/{arxiv}).",
        "",
        f"- parameters: {num_parameters:,}",
        f"- student: {config['student'] or 'initialised from the teacher'} (student_init: {config['student_init'] or 'default'})",
        f"- optimizer steps: {steps}; loss: generalized JSD, beta {config['beta']} on student samples, "
        f"off-policy beta {config['off_policy_beta'] if config['off_policy_beta'] is not None else config['beta']}; "
        f"lmbda {config['lmbda']} ({config['lmbda_schedule']}); seq_kd {config['seq_kd']}",
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
    if report is not None:
        lines += ["", "## Held-out evaluation", ""]
        lines += ["| student | forward KL (teacher completions) | reverse KL (own completions) | top-1 agreement |", "| --- | ---: | ---: | ---: |"]
        for name, metrics in report["metrics"].items():
            on_teacher = metrics.get("on_teacher_completions")  # absent for a teacher that only scores
            shown = (f"{on_teacher['forward_kl']:.3f}", f"{on_teacher['top1_agreement']:.3f}") if on_teacher else ("n/a", "n/a")
            lines.append(f"| {name} | {shown[0]} | {metrics['on_student_completions']['reverse_kl']:.3f} | {shown[1]} |")
    lines += ["", "## Citation", "", "```bibtex", "@inproceedings{agarwal2024onpolicy,", f"  title={{{title}}},",
              "  author={Agarwal, Rishabh and Vieillard, Nino and Zhou, Yongchao and Stanczyk, Piotr and Ramos, Sabela and Geist, Matthieu and Bachem, Olivier},",
              "  booktitle={ICLR}, year={2024},", f"  eprint={{{arxiv}}}, archivePrefix={{arXiv}}", "}", "```", ""]
    path = Path(model_dir) / "README.md"
    path.write_text("\n".join(lines))
    return path
