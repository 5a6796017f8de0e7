"""Long-run hardening: a tiny model trained for 500 steps, killed (SIGKILL) and resumed every 50 steps,
against an uninterrupted run of the same config; resident memory after step 50 and after step 500.

The models are tiny random Llamas (a 2-layer student, a 3-layer teacher) with a byte-level BPE tokenizer
trained here on the bundled prompts, saved to a temporary directory; the method is gkd with its default
mix (student samples and teacher samples), checkpoints every `--every` steps. The interrupted run is
`distill train` in a child process, killed with SIGKILL at a random moment after each new checkpoint and
continued with `distill train --resume` (after removing the killed run's lock, as distill's message asks),
until it finishes. Its final weights and last optimizer state
must be torch.equal to the uninterrupted run's.

    python benchmarks/soak.py [--steps 500] [--every 50]
Writes benchmarks/results/soak.json and prints a summary (a few minutes on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_result  # a sibling script: the result with its environment

REPO = Path(__file__).resolve().parents[1]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_models(root: Path) -> dict[str, Path]:
    """A tokenizer trained on the bundled prompts, and tiny random teacher and student directories."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    prompts = REPO / "src" / "distill" / "recipes" / "data" / "prompts.jsonl"
    texts = [json.loads(line)["messages"][0]["content"] for line in prompts.read_text().splitlines()]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts + ["user assistant system"], trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|im_start|>", "<|im_end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                   bos_token="<|im_start|>")
    fast.chat_template = CHAT_TEMPLATE
    dirs = {}
    for name, layers, seed in (("teacher", 3, 1), ("student", 2, 2)):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=len(fast), hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                             tie_word_embeddings=True, eos_token_id=fast.eos_token_id, pad_token_id=fast.eos_token_id,
                             bos_token_id=fast.bos_token_id, initializer_range=0.2)
        LlamaForCausalLM(config).save_pretrained(root / name)
        fast.save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


def flags(models: dict[str, Path], run_dir: Path, steps: int, every: int) -> list[str]:
    values = {"teacher": models["teacher"], "student": models["student"], "output_dir": run_dir, "max_steps": steps,
              "save_steps": every, "save_total_limit": 2, "max_new_tokens": 8, "max_prompt_length": 48,
              "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "learning_rate": 1e-3,
              "lr_scheduler_type": "cosine", "warmup_steps": 10, "logging_steps": 10, "eval_before_after": False,
              "progress_bar": False, "lmbda_schedule_steps": steps // 4, "loss_chunk_size": 64}
    return [item for name, value in values.items() for item in (f"--{name}", str(value))]


def uninterrupted(models: dict[str, Path], run_dir: Path, steps: int, every: int) -> dict:
    """Train in this process, recording resident memory after step 50 and the last step."""
    import psutil

    from distill import DistillConfig
    from distill.cli import parse_field_flags
    from distill.training.trainer import Distiller

    config = DistillConfig.from_dict(parse_field_flags(flags(models, run_dir, steps, every)))
    run = Distiller(config)
    memory, original = {}, run.train_step

    def recording(step, window, timings, log_step):
        original(step, window, timings, log_step)
        if step + 1 in (50, steps):
            memory[step + 1] = psutil.Process().memory_info().rss
    run.train_step = recording  # type: ignore[method-assign]  # the memory at two steps recorded
    start = time.perf_counter()
    run.train()
    return {"seconds": time.perf_counter() - start, "rss_bytes": memory}


def interrupted(models: dict[str, Path], run_dir: Path, steps: int, every: int, seed: int) -> dict:
    """`distill train` killed with SIGKILL after each new checkpoint, resumed until it finishes."""
    chooser = random.Random(seed)
    command = [sys.executable, "-m", "distill", "train", *flags(models, run_dir, steps, every)]
    kills: list[int] = []
    start = time.perf_counter()
    while True:
        done = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*")) if run_dir.exists() else []
        last = done[-1] if done else 0
        process = subprocess.Popen(command if last == 0 and not kills else
                                   [sys.executable, "-m", "distill", "train", "--resume", str(run_dir)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        target = run_dir / "checkpoints" / f"step-{min(last + every, steps):06d}"
        while process.poll() is None and not target.exists():
            time.sleep(0.05)
        if process.poll() is None and last + every < steps:
            time.sleep(chooser.uniform(0.0, 0.5))  # somewhere in the steps after the checkpoint (50 take ~1 s)
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()
                # The killed run leaves its lock; distill refuses to guess that it is stale, and asks for this.
                (run_dir / "run.lock").unlink()
                kills.append(max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*")))
                continue
        if process.wait() != 0:
            raise RuntimeError(f"distill train exited with {process.returncode} (after kills at {kills}): "
                               f"{process.stderr.read()[-2000:] if process.stderr else ''}")
        return {"seconds": time.perf_counter() - start, "killed_after_checkpoints": kills}


def compare(straight: Path, resumed: Path, steps: int) -> dict:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(straight / "model" / "model.safetensors")), load_file(str(resumed / "model" / "model.safetensors"))
    weights_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    last = f"checkpoints/step-{steps:06d}/optimizer.pt"
    oa, ob = (torch.load(p / last, weights_only=True)["state"] for p in (straight, resumed))
    optimizer_equal = oa.keys() == ob.keys() and all(
        torch.equal(oa[i][name], ob[i][name]) for i in oa for name in oa[i] if isinstance(oa[i][name], torch.Tensor))
    return {"weights_equal": weights_equal, "optimizer_state_equal": optimizer_equal, "tensors": len(a)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=int, default=50, help="checkpoint (and kill) every this many steps")
    parser.add_argument("--seed", type=int, default=0, help="when the kills fall")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "soak.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models = make_models(root)
        straight = uninterrupted(models, root / "straight", args.steps, args.every)
        resumed = interrupted(models, root / "resumed", args.steps, args.every, args.seed)
        verdict = compare(root / "straight", root / "resumed", args.steps)
    rss = straight.pop("rss_bytes")
    result = {"steps": args.steps, "every": args.every, "uninterrupted": straight, "interrupted": resumed, **verdict,
              "rss_mb_after_step_50": rss.get(50, 0) / 2**20, f"rss_mb_after_step_{args.steps}": rss.get(args.steps, 0) / 2**20}
    print(f"{args.steps} steps, {len(resumed['killed_after_checkpoints'])} SIGKILLs, each some steps after the checkpoint "
          f"of step {resumed['killed_after_checkpoints']}")
    print(f"final weights torch.equal: {verdict['weights_equal']}; last optimizer state torch.equal: {verdict['optimizer_state_equal']}")
    print(f"resident memory: {result['rss_mb_after_step_50']:.0f} MB after step 50, "
          f"{result[f'rss_mb_after_step_{args.steps}']:.0f} MB after step {args.steps}")
    write_result(args.out, result)
    if not (verdict["weights_equal"] and verdict["optimizer_state_equal"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
