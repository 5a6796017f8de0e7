"""The model card (README.md) written next to the final student: what it is, how it was made, citations."""

from __future__ import annotations

from pathlib import Path

PAPERS = {
    "gold": ("Towards Cross-Tokenizer Distillation: the Universal Logit Distillation Loss for LLMs (ULD)", "Boizard et al., 2024", "2402.12030"),
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


BIBTEX = {
    "gkd": ("agarwal2024onpolicy", "Agarwal, Rishabh and Vieillard, Nino and Zhou, Yongchao and Stanczyk, Piotr and Ramos, Sabela "
            "and Geist, Matthieu and Bachem, Olivier", "booktitle={ICLR}, year={2024}"),
    "gold": ("boizard2024uld", "Boizard, Nicolas and El Haddad, Kevin and Hudelot, C{\\'e}line and Colombo, Pierre",
             "booktitle={arXiv preprint}, year={2024}"),
}


def _loss_line(config: dict) -> str:
    off_beta = config["off_policy_beta"] if config["off_policy_beta"] is not None else config["beta"]
    if config["method"] == "gold":
        kind = "hybrid ULD (matched tokens: generalized JSD)" if config.get("uld_use_hybrid_loss") else "ULD"
        return f"{kind} on byte-aligned token groups across tokenizers"
    return f"generalized JSD, beta {config['beta']} on student samples, off-policy beta {off_beta}"


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
        f"- optimizer steps: {steps}; loss: {_loss_line(config)}; "
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
    key, authors_bib, venue = BIBTEX.get(config["method"], BIBTEX["gkd"])
    lines += ["", "## Citation", "", "```bibtex", f"@inproceedings{{{key},", f"  title={{{title}}},", f"  author={{{authors_bib}}},",
              f"  {venue},", f"  eprint={{{arxiv}}}, archivePrefix={{arXiv}}", "}", "```", ""]
    path = Path(model_dir) / "README.md"
    path.write_text("\n".join(lines))
    return path
