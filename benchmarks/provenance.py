"""What a benchmark's result was measured with, for its JSON: the versions of Python, torch, transformers and
distill, the git commit (and whether the tree had changes), the machine. Any benchmark can import it (the scripts
run from this folder, so `from provenance import provenance`)."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def provenance() -> dict:
    """{"python", "torch", "transformers", "distill", "commit", "dirty", "machine", "cpus"}; a field that cannot be
    read is None."""
    try:
        import torch

        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    from distill.version import __version__

    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"python": platform.python_version(), "torch": torch_version, "transformers": _version("transformers"),
            "distill": __version__, "commit": _git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None
            else None, "machine": f"{platform.system()} {platform.machine()}", "cpus": os.cpu_count()}
