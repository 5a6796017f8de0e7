"""Sampling time of distill's lean decode loop vs HF `generate` for the default student and teacher (CPU, float32).

    python benchmarks/generation.py              # 4 prompts x 64 new tokens, 3 alternating rounds per model
    python benchmarks/generation.py --rows 8 --new-tokens 48

Both sample at temperature 1 from the same left-padded prompts (the bundled dataset's first `--rows`) and stop
rows at EOS, so the table also counts the tokens each produced; seconds per call are medians over the rounds,
each call in its own seeded stream, the two loops alternating. The lean loop's weight packing happens inside every
call and is timed with it. Greedy tokens of both are compared once per model (equal unless a near tie).
Writes benchmarks/results/generation.json.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch
from provenance import write_result  # a sibling script: the result with its environment


def load_pair():
    from distill.config import DistillConfig
    from distill.models import (
        load_causal_lm,
        load_tokenizer,
        make_student,
        resolve_model_source,
    )

    source = resolve_model_source(DistillConfig().teacher, "teacher")
    teacher = load_causal_lm(source, torch.float32).eval()
    student = make_student(teacher, DistillConfig().resolved_student_init(False)).eval()
    return {"student": student, "teacher": teacher}, load_tokenizer(source)


def prompts(tokenizer, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    from distill.data_files import load_dataset_spec

    messages = load_dataset_spec("bundled", "train", "dataset")["messages"][:rows]
    encoded = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in messages]
    encoded = [e["input_ids"] if hasattr(e, "keys") else e for e in encoded]
    width = max(map(len, encoded))
    ids = torch.full((rows, width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for row, e in enumerate(encoded):
        ids[row, width - len(e):] = torch.tensor(e)
        mask[row, width - len(e):] = 1
    return ids, mask


def arguments(doc: str, rows: int, new_tokens: int, out: str) -> argparse.Namespace:
    """--rows, --new-tokens, --rounds and --out (benchmarks/results/`out`), the generation benchmarks' own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--new-tokens", type=int, default=new_tokens)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / out)
    return parser.parse_args()


def main() -> None:
    from distill.generation.lean_decode import lean_generate

    args = arguments(__doc__, 4, 64, "generation.json")

    models, tokenizer = load_pair()
    ids, mask = prompts(tokenizer, args.rows)
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id

    def hf(model, sample: bool) -> torch.Tensor:
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=sample,
                             temperature=1.0, top_k=0, top_p=1.0, eos_token_id=eos, pad_token_id=pad)
        return out[:, ids.shape[1]:]

    def lean(model, sample: bool) -> torch.Tensor:
        return lean_generate(model, ids, mask, max_new_tokens=args.new_tokens, do_sample=sample, temperature=1.0,
                             top_k=0, top_p=1.0, eos_ids=eos, pad_id=pad)[0]

    def generated_tokens(new: torch.Tensor) -> int:
        from distill.generation import first_eos_mask

        return int(first_eos_mask(new, eos).sum())

    results = {}
    print(f"{args.rows} prompts x {args.new_tokens} new tokens, float32, {torch.get_num_threads()} threads")
    print(f"{'model':>8} {'loop':>6} {'s/call':>8} {'ms/step':>8} {'tokens':>7} {'vs generate':>12}")
    for name, model in models.items():
        greedy_equal = torch.equal(hf(model, False), lean(model, False))
        times: dict[str, list[float]] = {"generate": [], "lean": []}
        tokens: dict[str, list[int]] = {"generate": [], "lean": []}
        with torch.no_grad():
            for round_ in range(args.rounds + 1):  # round 0 warms both up, untimed
                for loop, fn in (("generate", hf), ("lean", lean)):
                    torch.manual_seed(round_)
                    start = time.perf_counter()
                    new = fn(model, True)
                    if round_:
                        times[loop].append(time.perf_counter() - start)
                        tokens[loop].append(generated_tokens(new))
        row = {loop: {"seconds_per_call": statistics.median(times[loop]), "calls": times[loop],
                      "ms_per_decode_step": 1e3 * statistics.median(times[loop]) / args.new_tokens,
                      "tokens": statistics.median(tokens[loop])} for loop in times}
        row["ratio"] = row["lean"]["seconds_per_call"] / row["generate"]["seconds_per_call"]
        row["greedy_tokens_equal"] = greedy_equal
        results[name] = row
        for loop in ("generate", "lean"):
            r = row[loop]
            ratio = f"{row['ratio']:.2f}" if loop == "lean" else "1.00"
            print(f"{name:>8} {loop:>6} {r['seconds_per_call']:>8.2f} {r['ms_per_decode_step']:>8.1f} {r['tokens']:>7.0f} {ratio:>12}")
        print(f"{name:>8} greedy tokens equal to generate's: {greedy_equal}")
    write_results(args, results)


def write_results(args: argparse.Namespace, results: dict) -> None:
    """`args.out`: the settings, the machine and `results`, as JSON."""
    write_result(args.out, {"rows": args.rows, "new_tokens": args.new_tokens, "machine": platform.machine(),
                            "threads": torch.get_num_threads(), "results": results})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
