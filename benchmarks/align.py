"""Cross-tokenizer alignment throughput, and the ULD loss time per step vs the dense same-tokenizer loss.

The same multilingual text (accents, CJK, emoji) is used throughout. Teacher: SmolLM2's tokenizer
(V = 49152, H = 576). Pairs:
    smollm2 -> smollm2   the same tokenizer on both sides: groups are 1:1, so the ULD rows match the dense rows
    byte    -> smollm2   the recipe's pair: a byte-level student (V = 258, H = 256), ~3 bytes per teacher token
Reported:
    alignment: student ids -> text -> teacher ids -> aligned groups (what the teacher does per completion),
        in student tokens per second;
    loss: forward + backward of one step's loss from hidden states (random heads), median seconds:
        dense  = chunked generalized JSD (beta 0.5), same tokenizer;
        uld    = chunked ULD on the aligned groups (plain, and hybrid with the matched vocabulary).

    python benchmarks/align.py                  # ~1-2 minutes on 2 cores
    python benchmarks/align.py --tokens 2048
Writes benchmarks/results/align.json (override with --out).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from provenance import write_result  # a sibling script: the result with its environment

PARAGRAPHS = [
    "The café on the corner serves crème brûlée and a naïve little rosé; Zoë says it is déjà vu every time. ",
    "東京は日本の首都で、ありがとうございます。北京欢迎你，今天天气很好。 ",
    "Emoji are bytes too: 🙂👍🏽🎉 — and so is the em dash, «guillemets», and ü, ß, ø. ",
    "def f(x):\n    return x ** 2 + 3 * x - 1  # plain code, ASCII only\n",
]


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="teacher tokens of text per step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "align.json")
    args = parser.parse_args()

    from distill.align import TokenBytes, align_groups, paired_groups, text_and_ends
    from distill.losses import LogitHead, chunked_generalized_jsd
    from distill.losses.uld import Alignment, ULDSettings, VocabularyMatch, chunked_uld
    from distill.models import load_tokenizer, resolve_model_source
    from distill.models.byte_student import byte_tokenizer

    teacher_tok = load_tokenizer(resolve_model_source("smollm2-135m-instruct", "teacher"))
    text = ""
    while len(teacher_tok(text, add_special_tokens=False)["input_ids"]) < args.tokens:
        text += "".join(PARAGRAPHS)
    teacher_ids_all = teacher_tok(text, add_special_tokens=False)["input_ids"][: args.tokens]
    text = teacher_tok.decode(teacher_ids_all)
    teacher_table = TokenBytes.from_tokenizer(teacher_tok, "teacher")
    students = {"smollm2": (teacher_tok, 576), "byte": (byte_tokenizer(), 256)}
    torch.manual_seed(0)
    teacher_hidden_size, teacher_vocab = 576, len(teacher_tok)
    teacher_head = LogitHead(torch.randn(teacher_vocab, teacher_hidden_size) * 0.05)

    rows = []
    print(f"text: {len(text)} characters, {len(text.encode())} bytes, {len(teacher_ids_all)} teacher tokens; "
          f"CPU threads={os.cpu_count()} chunk_size={args.chunk_size}")
    print(f"{'pair':>18} {'student tok':>11} {'groups':>7} {'align tok/s':>12} {'loss':>12} {'median s':>9} {'vs dense':>9}")
    dense_seconds = 0.0  # the dense loss's time on the teacher's own tokenizer: the first student, smollm2
    for name, (student_tok, hidden) in students.items():
        student_table = TokenBytes.from_tokenizer(student_tok, "student")
        student_ids = student_tok(text, add_special_tokens=False)["input_ids"]

        def align():
            body_text, ends = text_and_ends(student_table, student_ids)
            teacher_ids = teacher_tok(body_text, add_special_tokens=False)["input_ids"]
            s, t, count = align_groups(ends, teacher_table.ends(teacher_ids))
            return paired_groups(s, t, count)

        groups = align()
        align_seconds = median_seconds(align, args.repeats)
        n, g = len(student_ids), len(groups)
        row_group = torch.full((n,), -1, dtype=torch.long)
        row_last = torch.zeros(n, dtype=torch.bool)
        for index, (s_pos, _) in enumerate(groups):
            row_group[s_pos] = index
            row_last[s_pos[-1]] = True
        alignment = Alignment(row_group, row_last, torch.tensor([float(len(s)) for s, _ in groups]))
        student_hidden = torch.randn(n, hidden, requires_grad=True)
        student_head = (torch.randn(len(student_tok), hidden) * 0.05).requires_grad_()
        targets = torch.tensor(student_ids, dtype=torch.long)
        teacher_hidden = torch.randn(g, teacher_hidden_size)
        prefix = torch.zeros(g)
        match = VocabularyMatch.from_tokenizers(student_tok, teacher_tok, len(student_tok), teacher_vocab)
        variants = {"uld": ULDSettings(), "uld hybrid": ULDSettings(match, match.size / teacher_vocab, 1 - match.size / teacher_vocab)}
        if name == "smollm2":
            teacher_rows = torch.randn(n, teacher_hidden_size)

            def dense():
                student_hidden.grad = student_head.grad = None
                chunked_generalized_jsd(student_hidden, student_head, teacher_rows, teacher_head.weight, beta=0.5,
                                        chunk_size=args.chunk_size).loss_sum.backward()

            dense_seconds = median_seconds(dense, args.repeats)
            rows.append({"pair": f"{name} -> smollm2", "loss": "dense jsd", "student_tokens": n, "groups": n,
                         "seconds": dense_seconds, "time_ratio_vs_dense": 1.0})
            print(f"{name + ' -> smollm2':>18} {n:>11} {n:>7} {'':>12} {'dense jsd':>12} {dense_seconds:>9.3f} {1.0:>9.2f}")
        for label, settings in variants.items():
            def uld():
                student_hidden.grad = student_head.grad = None
                chunked_uld(student_hidden, LogitHead(student_head), targets, alignment, teacher_hidden, teacher_head, prefix,
                            settings, beta=0.5, temperature=1.0, chunk_size=args.chunk_size).loss_sum.backward()

            seconds = median_seconds(uld, args.repeats)
            row = {"pair": f"{name} -> smollm2", "loss": label, "student_tokens": n, "groups": g,
                   "alignment_tokens_per_second": n / align_seconds, "seconds": seconds,
                   "time_ratio_vs_dense": seconds / dense_seconds, "matched_tokens": match.size}
            rows.append(row)
            print(f"{row['pair']:>18} {n:>11} {g:>7} {n / align_seconds:>12.0f} {label:>12} {seconds:>9.3f} {row['time_ratio_vs_dense']:>9.2f}",
                  flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"teacher_tokens": len(teacher_ids_all), "bytes": len(text.encode()), "chunk_size": args.chunk_size, "repeats": args.repeats,
            "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}
    write_result(args.out, {"meta": meta, "rows": rows}, ensure_ascii=False)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
