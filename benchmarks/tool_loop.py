"""Speed of tool-loop rollouts: completion tokens per second of multi-turn tool-calling conversations, distill's tool
loop against the reference library's (TRL 1.16.0 `DistillationTrainer`: its student generation and tool loop only,
`trl_tool_loop.py`), on the same model, template, tools, prompts and budget, as the number of turns grows.

The task: the lookup registry (`distill.tasks.lookup`). Each prompt asks for the codes of several invented names, one
lookup per turn, and shows a few turns of that already done (assistant turns calling `lookup_code`, the tool's
results), so the untuned default model (SmolLM2-135M-Instruct) goes on calling the tool turn after turn. Both
libraries render with the same chat template: TRL's own `qwen2_5.jinja` (ChatML with Hermes-style tool calls, which
TRL's tool loop needs and which SmolLM2's tokenizer writes with its `<|im_start|>`/`<|im_end|>`). Greedy decoding, so
both sample the same conversations (where they do not, the table says how many differ).

Arms, each timed over the same batch of prompts after an untimed warm-up, alternating, `--repeats` times:
- distill: the tool loop as a run samples it (`distill.agents.setup.tool_loop`, the lean engine), with each
  conversation's cache kept from turn to turn (`ConversationCache`);
- distill, re-encoding: the same loop, each turn's context re-encoded whole (no cache);
- trl: `DistillationTrainer`'s rollout (`_generate` with `tools`), HF `generate` each turn.
A row's completion tokens are the tokens the model sampled (tool-result tokens excluded); tokens/s is their sum over
the batch divided by the rollout's wall time (tool calls included: the same trivial lookup in every arm).

    python benchmarks/tool_loop.py [--turns 1 2 4 8] [--rows 4] [--shots 3] [--repeats 2] [--threads 2]
Prints a table; writes benchmarks/results/tool_loop.json (with `provenance`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from provenance import write_result  # a sibling script: the result with its environment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trl_tool_loop import QWEN2_5_TEMPLATE, lookup_prompts, trl_rollouts  # noqa: E402  (a sibling script)

from distill.agents.setup import offering_tools, tool_loop
from distill.config import DistillConfig
from distill.data import examples_from_dataset
from distill.data_files import load_dataset_spec
from distill.generation import SamplingParams, generate_completions
from distill.generation.engine import ConversationCache
from distill.models import DEFAULT_TEACHER, eos_token_ids
from distill.rendering import TextRenderer
from distill.tasks.lookup import lookup_code
from distill.teachers.build import load_model

TOOL = "distill.tasks.lookup:lookup_code"
RESULTS = Path(__file__).resolve().parent / "results" / "tool_loop.json"


class DistillLoop:
    """distill's tool loop over fixed prompts (greedy, the lean engine), as a run's student sampler calls it; built once,
    so the tool workers a run keeps from step to step are started by the warm-up, not timed."""

    def __init__(self, model, tokenizer, prompts: list[list[dict]], *, max_turns: int, budget: int):
        self.model, self.tokenizer = model, tokenizer
        self.eos = eos_token_ids(tokenizer, model)
        config = DistillConfig(tools=[TOOL], max_new_tokens=budget, max_turns=max_turns, max_prompt_length=2048)
        renderer = offering_tools(config, TextRenderer(tokenizer, 2048, budget, self.eos))
        loop = tool_loop(config, renderer, budget)
        assert loop is not None
        self.loop = loop
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "rows.jsonl"
            path.write_text("".join(json.dumps({"prompt": messages}) + "\n" for messages in prompts))
            self.examples = examples_from_dataset(load_dataset_spec(str(path), "train", "dataset"), "dataset")
        self.prompt_ids = [renderer.prompt(example).ids for example in self.examples]

    def rollouts(self, cached: bool) -> dict:
        """One rollout of every prompt: completion tokens, seconds, turns and calls per conversation, their ids."""
        cache = ConversationCache() if cached else None

        def generate(batch, max_new_tokens, turn, rows):
            sampling = SamplingParams(1.0, 1.0, 0, max_new_tokens, do_sample=False, engine="lean")
            return generate_completions(self.model, batch, sampling, self.eos, self.tokenizer.pad_token_id,
                                        torch.device("cpu"), conversations=cache,
                                        conversation_keys=rows if cached else None)

        start = time.perf_counter()
        trajectories, _ = self.loop.run(generate, self.prompt_ids, self.examples, self.eos)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "completion_tokens": sum(sum(p.trained) for t in trajectories for p in t.pieces),
                "turns": [t.turns for t in trajectories], "calls": [t.calls for t in trajectories],
                "ids": [t.ids for t in trajectories]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4, 8], help="max_turns of each measurement")
    parser.add_argument("--rows", type=int, default=4, help="conversations per rollout (one batch)")
    parser.add_argument("--shots", type=int, default=3, help="lookups already done in each prompt")
    parser.add_argument("--budget", type=int, default=1024, help="completion tokens per conversation (max_new_tokens)")
    parser.add_argument("--repeats", type=int, default=2, help="timed rollouts per arm and turn count, alternating")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(DEFAULT_TEACHER, "student", torch.device("cpu"))
    tokenizer.chat_template = QWEN2_5_TEMPLATE.read_text()
    tools = [lookup_code]
    rows = []
    for max_turns in args.turns:
        prompts = lookup_prompts(args.rows, max_turns + 1, seed=0, answered=args.shots)
        distill_loop = DistillLoop(model, tokenizer, prompts, max_turns=max_turns, budget=args.budget)
        arms = {
            "distill": partial(distill_loop.rollouts, cached=True),
            "distill_reencoding": partial(distill_loop.rollouts, cached=False),
            # builds its trainer and rolls out one batch untimed before the timed one
            "trl": partial(trl_rollouts, model, tokenizer, prompts, tools, max_completion_length=args.budget,
                           max_tool_calling_iterations=max_turns - 1, temperature=0.0, batch_size=args.rows, seed=0),
        }
        distill_loop.rollouts(cached=True)  # warm-up: the tool workers, MKL's first calls
        runs: dict[str, list[dict]] = {name: [] for name in arms}
        for _ in range(args.repeats):
            for name, run in arms.items():
                runs[name].append(run())
        row = {"max_turns": max_turns}
        for name, results in runs.items():
            rates = [r["completion_tokens"] / r["seconds"] for r in results]
            row[name] = {"tokens_per_second": statistics.median(rates), "runs": [
                {k: v for k, v in r.items() if k not in ("ids", "texts")} for r in results]}
            row[name]["mean_turns"] = statistics.fmean(results[-1]["turns"])
            row[name]["mean_calls"] = statistics.fmean(results[-1]["calls"])
        cached_ids, plain_ids = runs["distill"][-1]["ids"], runs["distill_reencoding"][-1]["ids"]
        row["conversations_differing_cache_vs_reencoding"] = sum(a != b for a, b in zip(cached_ids, plain_ids))
        row["speedup_vs_trl"] = row["distill"]["tokens_per_second"] / row["trl"]["tokens_per_second"]
        row["speedup_vs_reencoding"] = row["distill"]["tokens_per_second"] / row["distill_reencoding"]["tokens_per_second"]
        rows.append(row)
        distill_loop.loop.close()
        print(f"max_turns {max_turns}: " + ", ".join(f"{name} {row[name]['tokens_per_second']:.1f} tok/s "
                                                     f"({row[name]['mean_turns']:.1f} turns)" for name in arms)
              + f"; vs trl {row['speedup_vs_trl']:.2f}x, vs re-encoding {row['speedup_vs_reencoding']:.2f}x", flush=True)
    print(f"\n{'max_turns':>9} {'distill':>9} {'re-enc':>9} {'trl':>9} {'x trl':>6} {'x re-enc':>8} {'turns':>6} {'differ':>6}")
    for row in rows:
        print(f"{row['max_turns']:>9} {row['distill']['tokens_per_second']:>9.1f} "
              f"{row['distill_reencoding']['tokens_per_second']:>9.1f} {row['trl']['tokens_per_second']:>9.1f} "
              f"{row['speedup_vs_trl']:>6.2f} {row['speedup_vs_reencoding']:>8.2f} {row['distill']['mean_turns']:>6.1f} "
              f"{row['conversations_differing_cache_vs_reencoding']:>6}")
    write_result(RESULTS, {"settings": vars(args), "rows": rows})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
