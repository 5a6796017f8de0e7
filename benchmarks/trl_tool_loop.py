"""The reference library's tool-call rollout, on its own: trl's `DistillationTrainer` sampling conversations with
tools, so that a benchmark can time it against distill's tool-call loop on the same prompts and model.

What runs is `DistillationTrainer._generate(prompts)` (trl 1.16.0): the one method that does a batch's whole rollout
and nothing more. It renders the prompts with the tools (`_tokenize_prompts`: the chat template, once per row), samples
the first turn (`_generate_single_turn`: `model.generate` on the left-padded batch), parses each turn into a message
(`parse_response` with the response template trl's `add_response_schema` set on the tokenizer), then runs the
tool-call loop (`_tool_call_loop`): the calls, the tool turns' ids (`_get_tool_suffix_ids`: a dummy conversation
rendered with and without the tool messages, the difference appended to the ids so far, nothing re-tokenized), the
next turn sampled for the rows that called a tool, until no row calls one, `max_tool_calling_iterations` rounds, or
`max_completion_length`. No teacher forward, no loss, no optimizer step: `_generate_and_score_completions` and the
training step around it are left out.

What that costs, as trl does it: every turn is a fresh `model.generate` on the whole context (prompt, earlier turns,
tool turns), so each turn prefills it again (no cache kept across turns); every turn may sample up to
`max_completion_length` new tokens, cut afterwards to what the budget has left; a tool result that would not fit the
budget is rolled back and the row stops.

The trainer is built for real (student and teacher the same model object, `use_vllm=False`, on the CPU) with the
caller's model and tokenizer; the caller sets the tokenizer's chat template (trl's `qwen2_5.jinja` for SmolLM2, whose
`<|im_start|>`/`<|im_end|>` it shares), and the trainer itself sets the tool-call parser for it. The conversations
each rollout ends with are read off `_tool_call_loop`'s return value (an instance wrapper around trl's own method:
the turns and calls it parsed), the rest off `_generate`'s.

Run by hand (a short trial on the bundled lookup task's registry, conversations in progress, one thread):

    python benchmarks/trl_tool_loop.py [--prompts 4] [--names 5] [--iterations 4] [--max_completion_length 512]
Prints each conversation's turns, calls and text, and the rollouts' tokens per second; writes no file.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import transformers
import trl
from trl import DistillationConfig, DistillationTrainer

from distill.models import DEFAULT_TEACHER
from distill.tasks.lookup import REGISTRY, lookup_code
from distill.teachers.build import load_model

QWEN2_5_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"


def _generation_kwargs(temperature: float) -> dict[str, Any]:
    """What overrides trl's sampling settings: temperature 0 is greedy decoding (`do_sample=False`, trl's
    `generation_kwargs` override its `do_sample=True`; the sampling knobs unset so that transformers does not warn
    about them); any other temperature samples from the full distribution (trl's defaults: top_p 1, top_k 0)."""
    if temperature == 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {}


def build_trainer(model, tokenizer, tools: list[Callable], *, max_completion_length: int, max_tool_calling_iterations: int,
                  temperature: float, batch_size: int, seed: int, output_dir: str) -> DistillationTrainer:
    """A `DistillationTrainer` that only rolls out: `model` as student and teacher, on the CPU, no vLLM, no logging.
    Sets `tokenizer.response_template` (trl's parser for the template) when the tokenizer has none."""
    if temperature < 0:
        raise ValueError(f"temperature: {temperature} is negative; give 0 (greedy) or a positive temperature")
    config = DistillationConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False, use_vllm=False,
        per_device_train_batch_size=batch_size, max_completion_length=max_completion_length,
        max_tool_calling_iterations=max_tool_calling_iterations, temperature=temperature if temperature > 0 else 1.0,
        generation_kwargs=_generation_kwargs(temperature), seed=seed,
    )
    return DistillationTrainer(model=model, teacher_model=model, args=config, processing_class=tokenizer, tools=tools)


class _RecordedLoop:
    """trl's `_tool_call_loop`, called unchanged; keeps the conversations it returns (per row: the assistant and tool
    messages of the rollout, the messages trl parsed), which `_generate` does not hand back."""

    def __init__(self, trainer: DistillationTrainer):
        self.loop = trainer._tool_call_loop
        self.conversations: list[list[dict]] = []

    def __call__(self, *args):
        result = self.loop(*args)
        self.conversations = result[1]
        return result


def trl_rollouts(model, tokenizer, prompts: list[list[dict]], tools: list[Callable], *, max_completion_length: int,
                 max_tool_calling_iterations: int, temperature: float, batch_size: int, seed: int) -> dict:
    """trl's rollouts of `prompts`, `batch_size` conversations per `_generate` call, timed.

    `model`: a causal LM (float32, CPU); `tokenizer`: its tokenizer with a chat template trl knows how to parse (trl's
    `qwen2_5.jinja`, `QWEN2_5_TEMPLATE`, for SmolLM2); `prompts`: N conversations (OpenAI-style message lists:
    system, user, assistant with `tool_calls`, tool), rendered by trl with `tools`. `temperature` 0 decodes greedily
    (`do_sample=False` through trl's `generation_kwargs`), otherwise samples at that temperature (top_p 1, top_k 0);
    the generators are seeded with `seed` before the timed rollouts. One conversation (the first) is rolled out
    first, untimed.

    Returns:
      seconds: wall time of the N rollouts (trainer construction and the warm-up excluded);
      completion_tokens: the tokens the model sampled (trl's `tool_mask` 1: tool turns' ids excluded), summed;
      total_tokens: the completions' ids (the sampled ones and the tool turns' between them), summed;
      turns: per conversation, the model's turns (assistant messages of the rollout), N ints;
      calls: per conversation, the tool calls trl parsed from its turns, the last turn's unrun ones included, N ints;
      answered: per conversation, the tool results that joined it (rolled-back ones not), N ints;
      texts: per conversation, its completion ids decoded with the special tokens, N strings.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size: {batch_size}; give 1 or more")
    if not prompts or not tools:
        raise ValueError("prompts and tools: give at least one of each (without tools trl's rollout has no tool loop)")
    batches = [prompts[start:start + batch_size] for start in range(0, len(prompts), batch_size)]
    with tempfile.TemporaryDirectory(prefix="trl-tool-loop-") as output_dir:
        trainer = build_trainer(model, tokenizer, tools, max_completion_length=max_completion_length,
                                max_tool_calling_iterations=max_tool_calling_iterations, temperature=temperature,
                                batch_size=batch_size, seed=seed, output_dir=output_dir)
        recorder = _RecordedLoop(trainer)
        trainer._tool_call_loop = recorder
        trainer._generate(batches[0][:1])  # warm-up: one conversation
        transformers.set_seed(seed)
        completions: list[list[int]] = []
        masks: list[list[int]] = []
        conversations: list[list[dict]] = []
        seconds = 0.0
        for batch in batches:
            recorder.conversations = []
            start = time.perf_counter()
            _, completion_ids, tool_mask, _, _ = trainer._generate(batch)
            seconds += time.perf_counter() - start
            completions += completion_ids
            masks += tool_mask
            conversations += recorder.conversations
    assistant = [[m for m in conversation if m["role"] == "assistant"] for conversation in conversations]
    return {
        "seconds": seconds,
        "completion_tokens": sum(sum(mask) for mask in masks),
        "total_tokens": sum(len(ids) for ids in completions),
        "turns": [len(turns) for turns in assistant],
        "calls": [sum(len(m.get("tool_calls") or []) for m in turns) for turns in assistant],
        "answered": [sum(m["role"] == "tool" for m in conversation) for conversation in conversations],
        "texts": [tokenizer.decode(ids, skip_special_tokens=False) for ids in completions],
    }


def _call(name: str) -> dict:
    return {"type": "function", "function": {"name": "lookup_code", "arguments": {"name": name}}}


def lookup_prompts(count: int, names_per_prompt: int, seed: int, answered: int = 3) -> list[list[dict]]:
    """`count` conversations on the lookup task's registry, each in progress: a system message, a user asking for the
    codes of `answered + names_per_prompt` names one at a time, then the first `answered` of them already looked up
    (an assistant turn calling `lookup_code`, its result, per name). With three calls in its history the default
    135M model goes on calling the tool, one call a turn (greedy; it often picks a name already asked)."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        names = rng.sample(list(REGISTRY), answered + names_per_prompt)
        conversation: list[dict] = [
            {"role": "system", "content": "You look up registry codes with the lookup_code tool, one name per turn."},
            {"role": "user", "content": f"Look up the codes of {', '.join(names)}, one at a time."}]
        for name in names[:answered]:
            conversation += [{"role": "assistant", "content": "", "tool_calls": [_call(name)]},
                             {"role": "tool", "name": "lookup_code", "content": lookup_code(name)}]
        prompts.append(conversation)
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--names", type=int, default=5, help="names each prompt asks for")
    parser.add_argument("--iterations", type=int, default=4, help="max_tool_calling_iterations")
    parser.add_argument("--max_completion_length", type=int, default=512)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = load_model(DEFAULT_TEACHER, "student")
    tokenizer.chat_template = QWEN2_5_TEMPLATE.read_text()
    result = trl_rollouts(model, tokenizer, lookup_prompts(args.prompts, args.names, args.seed), [lookup_code],
                          max_completion_length=args.max_completion_length, max_tool_calling_iterations=args.iterations,
                          temperature=args.temperature, batch_size=args.batch_size, seed=args.seed)
    for i, text in enumerate(result["texts"]):
        print(f"--- conversation {i}: {result['turns'][i]} turns, {result['calls'][i]} calls, "
              f"{result['answered'][i]} answered\n{text}")
    print(f"{result['seconds']:.2f} s, {result['completion_tokens']} sampled tokens "
          f"({result['completion_tokens'] / result['seconds']:.1f}/s), {result['total_tokens']} completion ids; "
          f"turns {result['turns']}, calls {result['calls']}")


if __name__ == "__main__":
    main()
