"""Where on-policy distillation stalls on the chain task: the one token that decides to answer instead of calling again.

After `benchmarks/agentic.py --task chain --student full` has trained its arms, this script runs the held-out questions
through the tool loop with a trained student (greedy, as the benchmark measures) and reads, at the first trained token
of every model turn, the student's and the teacher's log-probs over the whole vocabulary in that context. For each turn
index it gives the mean over questions of: the student's probability of the token it chose, the teacher's probability
of that token and of its own first choice, the reverse KL there, and that KL's share of the turn's summed reverse KL.

Then, at each question's last-turn decision token, the gradient of the per-token loss with respect to the student's
logits at that position (`distill.losses.generalized_jsd_loss`, one position, summed), for beta 0 (forward KL), 0.5
(the default JSD) and 1 (reverse KL): its norm, and its component on the teacher's first choice. A divergence whose
gradient vanishes where the student is sure of a token the teacher gives almost nothing cannot move that token, however
large the divergence: JSD is bounded by log 2 and saturates, the reverse KL's gradient is weighted by the student's
own probabilities, the forward KL's (p_student - p_teacher) does not shrink.

    python benchmarks/decision_token.py [--arm on_policy] [--runs runs/bench_chain/full] [--questions 8]
Writes benchmarks/results/decision_token.json and prints a table. About two minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from provenance import write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentic import TASKS, run_conversations  # noqa: E402  (a sibling script)

from distill.data import examples_from_dataset  # noqa: E402
from distill.data_files import load_dataset_spec  # noqa: E402
from distill.losses import generalized_jsd_loss  # noqa: E402
from distill.teachers.build import load_model  # noqa: E402

BETAS = (0.0, 0.5, 1.0)


def logit_gradient(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float) -> torch.Tensor:
    """d loss / d student logits at one position (V,): the per-token generalized JSD at `beta`, in float64."""
    logits = student_logits.double().clone().requires_grad_(True)
    generalized_jsd_loss(logits.view(1, 1, -1), teacher_logits.double().view(1, 1, -1), beta=beta, reduction="sum").backward()
    assert logits.grad is not None
    return logits.grad


def measure(arm_dir: Path, teacher_dir: Path, questions: int) -> dict:
    task = TASKS["chain"]
    examples = examples_from_dataset(load_dataset_spec(task.dataset, "heldout", "eval_dataset"), "eval_dataset")[:questions]
    trajectories, tokenizer = run_conversations(task, arm_dir / "model", examples)
    device = torch.device("cpu")
    student, _ = load_model(str(arm_dir / "model"), "student", device)
    teacher, _ = load_model(str(teacher_dir), "teacher", device)
    by_turn: dict[int, list[dict]] = {}
    decisions: list[dict] = []
    for trajectory in trajectories:
        assert len(trajectory.pieces) == 1, "the chain task's template preserves prefixes: one sequence per conversation"
        prompt = trajectory.pieces[0].prompt
        ids = torch.tensor([prompt + trajectory.ids])
        with torch.no_grad():  # position p predicts token p + 1
            student_logits = student(ids).logits[0].float()
            teacher_logits = teacher(ids).logits[0].float()
        student_lp, teacher_lp = student_logits.log_softmax(-1), teacher_logits.log_softmax(-1)
        reverse_kl = (student_lp.exp() * (student_lp - teacher_lp)).sum(-1)
        turns = [span for span in trajectory.layout.spans() if span.segment.assistant]
        for index, span in enumerate(turns):
            trained = [p for p in range(span.start, span.end) if trajectory.trained[p]]
            if not trained:
                continue
            at = len(prompt) + trained[0] - 1
            token = trajectory.ids[trained[0]]
            teacher_choice = int(teacher_lp[at].argmax())
            turn_kl = float(sum(reverse_kl[len(prompt) + p - 1] for p in trained))
            row = {"student_p": float(student_lp[at, token].exp()), "teacher_p": float(teacher_lp[at, token].exp()),
                   "teacher_choice_p": float(teacher_lp[at, teacher_choice].exp()), "reverse_kl": float(reverse_kl[at]),
                   "share_of_turn_kl": float(reverse_kl[at]) / turn_kl if turn_kl > 0 else 0.0,
                   "token": tokenizer.decode([token]), "teacher_choice": tokenizer.decode([teacher_choice])}
            by_turn.setdefault(index, []).append(row)
            if index == len(turns) - 1:
                gradients = {}
                for beta in BETAS:
                    gradient = logit_gradient(student_logits[at], teacher_logits[at], beta)
                    gradients[str(beta)] = {"norm": float(gradient.norm()), "on_teacher_choice": float(gradient[teacher_choice])}
                decisions.append({**row, "turn": index, "gradient": gradients})
    mean = {str(index): {key: sum(r[key] for r in rows) / len(rows) for key in
                         ("student_p", "teacher_p", "teacher_choice_p", "reverse_kl", "share_of_turn_kl")} | {"questions": len(rows)}
            for index, rows in sorted(by_turn.items())}
    gradient_means = {str(beta): {key: sum(d["gradient"][str(beta)][key] for d in decisions) / len(decisions)
                                  for key in ("norm", "on_teacher_choice")} for beta in BETAS}
    return {"by_turn": mean, "last_turn_gradient": gradient_means, "last_turn_decisions": decisions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arm", default="on_policy", help="the trained arm whose final model is read")
    parser.add_argument("--runs", type=Path, default=Path("runs/bench_chain/full"))
    parser.add_argument("--teacher", type=Path, default=Path("runs/bench_chain/teacher/model"))
    parser.add_argument("--questions", type=int, default=8, help="the first N held-out questions")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/decision_token.json"))
    args = parser.parse_args()
    if not (args.runs / args.arm / "model").is_dir():
        raise SystemExit(f"{args.runs / args.arm / 'model'} is missing: `python benchmarks/agentic.py --task chain "
                         f"--student full --arms {args.arm}` trains it")
    result = {"arm": args.arm, "runs": str(args.runs), "questions": args.questions, **measure(args.runs / args.arm,
                                                                                              args.teacher, args.questions)}
    print(f"{'turn':>4} {'p_student(token)':>17} {'p_teacher(token)':>17} {'p_teacher(own)':>15} {'reverse KL':>11} "
          f"{'share of turn':>14}")
    for index, row in result["by_turn"].items():
        print(f"{index:>4} {row['student_p']:>17.3f} {row['teacher_p']:>17.3f} {row['teacher_choice_p']:>15.3f} "
              f"{row['reverse_kl']:>11.2f} {row['share_of_turn_kl']:>14.2f}")
    print("last turn's first token, gradient on the student's logits:")
    for beta, row in result["last_turn_gradient"].items():
        print(f"  beta {beta}: norm {row['norm']:.4f}, on the teacher's choice {row['on_teacher_choice']:+.4f}")
    write_result(args.out, result, ensure_ascii=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
