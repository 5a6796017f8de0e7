"""A refactor changes no number: run the default and the bundled recipes at a base commit and on the working
tree, and compare their metrics line by line (timing fields aside).

    python scripts/refactor_parity.py --base af0a4b5                 # the default run whole + every recipe's first 2 steps
    python scripts/refactor_parity.py --base af0a4b5 --skip-default  # the recipes only (~10 minutes on 2 cores)
    python scripts/refactor_parity.py --base af0a4b5 --base-runs runs/parity-base   # keep the base side's results, and
                                                     # reuse those already there (the base commit's runs do not change)

Both commits (--head: HEAD by default, so commit first) are checked out in temporary `git worktree`s and run
with their own `src/` first on the path, so both sides use the same installed dependencies and editing the
working tree meanwhile changes nothing. The default run compares `metrics.jsonl` and `eval/eval.json`;
each recipe runs `--max_steps 2 --eval_max_prompts 2` (its evaluation on two prompts; a bundled set standing in for
a placeholder dataset) and compares both too. A recipe that needs
something outside the process (a teacher server, a cache) fails the same way on both sides and is reported as
such. Writes the verdicts to --out (JSON) and prints a table; exits 1 when a run differs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TIMING = ("tokens_per_second/", "time/", "seconds", "wall")
# Recipes whose `dataset` is a placeholder for the user's data: a bundled set with completions stands in.
STAND_INS = {"dataset_kd": ["--dataset", "bundled:facts"], "gkd": ["--dataset", "bundled:facts"]}


def untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(mark in k for mark in TIMING)}


def run(src: Path, args: list[str], out_dir: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    command = [sys.executable, "-m", "distill", "train", *args, "--output_dir", str(out_dir), "--overwrite_output_dir", "true",
               "--progress_bar", "false"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=out_dir.parent)
    return done.returncode, done.stderr[-2000:]


def kept_base_run(folder: Path, src: Path, flags: list[str]) -> tuple[Path, int, str]:
    """The base side's run of `flags`, from `folder` when it was kept there, else run now and kept (its metrics, its
    evaluation and its exit status; checkpoints and the model are not kept)."""
    done = folder / "done.json"
    if done.is_file() and json.loads(done.read_text())["flags"] == flags:
        record = json.loads(done.read_text())
        return folder, record["rc"], record["stderr"]
    if folder.exists():
        shutil.rmtree(folder)
    scratch = Path(tempfile.mkdtemp(prefix="parity-base-")) / "run"
    rc, stderr = run(src, flags, scratch)
    (folder / "eval").mkdir(parents=True)
    for kept in ("metrics.jsonl", "eval/eval.json"):
        if (scratch / kept).is_file():
            shutil.copy(scratch / kept, folder / kept)
    shutil.rmtree(scratch.parent)
    done.write_text(json.dumps({"flags": flags, "rc": rc, "stderr": stderr}))
    return folder, rc, stderr


def read_lines(path: Path) -> list[dict]:
    return [untimed(json.loads(line)) for line in path.read_text().splitlines()] if path.is_file() else []


def compare(name: str, base: Path, head: Path, with_eval: bool) -> dict:
    verdict: dict[str, Any] = {"name": name}
    a, b = read_lines(base / "metrics.jsonl"), read_lines(head / "metrics.jsonl")
    verdict["lines"] = len(a)
    verdict["differing_lines"] = [i for i, (x, y) in enumerate(zip(a, b)) if x != y] + (
        [] if len(a) == len(b) else [f"{len(a)} vs {len(b)} lines"])
    if with_eval and (base / "eval" / "eval.json").is_file():
        ea, eb = (json.loads((d / "eval" / "eval.json").read_text()) for d in (base, head))
        verdict["eval_identical"] = ea == eb
    verdict["identical"] = not verdict["differing_lines"] and verdict.get("eval_identical", True)
    return verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit before the change")
    parser.add_argument("--head", default="HEAD", help="the commit after it (default HEAD)")
    parser.add_argument("--skip-default", action="store_true", help="only the recipes' first two steps")
    parser.add_argument("--recipes", nargs="*", default=None, help="default: every bundled recipe")
    parser.add_argument("--out", type=Path, default=Path("runs/refactor_parity.json"))
    parser.add_argument("--base-runs", type=Path, default=None,
                        help="a folder keeping the base side's metrics and evaluation per commit; runs found there are not repeated")
    parser.add_argument("--keep", action="store_true", help="keep the runs' folders (checkpoints: gigabytes) to inspect")
    args = parser.parse_args()
    recipes = args.recipes if args.recipes is not None else sorted(p.stem for p in (ROOT / "src/distill/recipes").glob("*.yaml"))
    work = Path(tempfile.mkdtemp(prefix="parity-"))
    base_sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.base], check=True, capture_output=True,
                              text=True).stdout.strip()
    trees = {"base": work / "tree-base", "head": work / "tree-head"}
    for side, rev in (("base", args.base), ("head", args.head)):
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(trees[side]), rev], check=True, capture_output=True)
    verdicts = []
    try:
        jobs: list[tuple[str, list[str], bool]] = ([] if args.skip_default else [("default", [], True)]) + [
            (name, [name, *STAND_INS.get(name, []), "--max_steps", "2", "--eval_max_prompts", "2"], True) for name in recipes]
        for name, flags, with_eval in jobs:
            outcomes = {}
            for side, tree in trees.items():
                if side == "base" and args.base_runs is not None:
                    outcomes[side] = kept_base_run(args.base_runs / base_sha / name, tree / "src", flags)
                    continue
                src = tree / "src"
                out_dir = work / side / name
                out_dir.parent.mkdir(parents=True, exist_ok=True)
                outcomes[side] = (out_dir, *run(src, flags, out_dir))
            (base_dir, base_rc, base_err), (head_dir, head_rc, head_err) = outcomes["base"], outcomes["head"]
            if base_rc or head_rc:
                verdict: dict[str, Any] = {"name": name, "identical": base_rc == head_rc and base_rc != 0,
                           "failed": {"base": base_rc, "head": head_rc}, "error": (head_err or base_err).strip().splitlines()[-1:]}
            else:
                verdict = compare(name, base_dir, head_dir, with_eval)
            verdicts.append(verdict)
            print(f"{name:16s} {'identical' if verdict['identical'] else 'DIFFERS'}"
                  f"{'  (fails on both sides: ' + ' '.join(verdict['error']) + ')' if 'failed' in verdict else ''}", flush=True)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
        if args.keep:
            print(f"the runs are kept in {work}")
        else:
            shutil.rmtree(work)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"base": args.base, "head": args.head, "verdicts": verdicts}, indent=2))
    sys.exit(0 if all(v["identical"] for v in verdicts) else 1)


if __name__ == "__main__":
    main()
