"""The default teacher's architecture and tokenizer without its weights, for a machine the GGUF cannot reach.

The device machine of `benchmarks/gpu.sh` takes at most 64 MiB of files per call and has no internet; the
default teacher's GGUF is 94 MB. So the GPU check trains the default recipe on a teacher of the same shape
(SmolLM2-135M-Instruct's config, its tokenizer and chat template) with seeded random weights: the same
compute per step, not the same answers.

    python benchmarks/gpu_teacher.py export DIR        # here: config + tokenizer of the default teacher (4 MB)
    python benchmarks/gpu_teacher.py materialize DIR OUT   # there: OUT = DIR's files + seeded random weights

Refuses to write into an OUT that exists and is not empty (it writes only into a fresh directory).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def export(directory: Path) -> None:
    from transformers import AutoConfig

    from distill.config import DistillConfig
    from distill.models import load_tokenizer, resolve_model_source

    source = resolve_model_source(DistillConfig().teacher, "teacher")
    _fresh(directory)
    load_tokenizer(source).save_pretrained(directory)
    config = AutoConfig.from_pretrained(source.path, gguf_file=source.gguf_file) if source.gguf_file else AutoConfig.from_pretrained(source.path)
    config.save_pretrained(directory)
    print(f"wrote the default teacher's config and tokenizer to {directory}")


def materialize(directory: Path, out: Path, seed: int) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    _fresh(out)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.float32)
    model.save_pretrained(out)
    for file in directory.iterdir():
        if file.is_file() and not (out / file.name).exists():
            shutil.copy2(file, out / file.name)
    print(f"wrote a {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M-parameter teacher with seeded random weights to {out}")


def _fresh(directory: Path) -> None:
    if directory.exists() and any(directory.iterdir()):
        raise SystemExit(f"{directory} exists and is not empty: give a new directory")
    directory.mkdir(parents=True, exist_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("export").add_argument("directory", type=Path)
    make = commands.add_parser("materialize")
    make.add_argument("directory", type=Path)
    make.add_argument("out", type=Path)
    make.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "export":
        export(args.directory)
    else:
        materialize(args.directory, args.out, args.seed)


if __name__ == "__main__":
    main()
