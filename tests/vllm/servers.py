"""Starting a stock vLLM OpenAI-compatible server for a test module (tiny models, CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import tiny_lm


def save_models(root: Path, tokenizer) -> dict[str, Path]:
    """Tiny teacher (3 layers) and student (2 layers) directories with the tokenizer; head_dim 64."""
    dirs = {}
    for name, layers, seed in (("teacher", 3, 1), ("student", 2, 2)):
        dirs[name] = root / name
        tiny_lm(len(tokenizer), layers=layers, seed=seed, hidden=128, eos_token_id=tokenizer.eos_token_id).save_pretrained(dirs[name])
        tokenizer.save_pretrained(dirs[name])
    return dirs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, log: Path, *flags: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m vllm.entrypoints.openai.api_server --model model_dir ...` on a free loopback port, once /health
    answers (at most 300 s)."""
    port = _free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
               "--kv-cache-memory-bytes", str(256 << 20), *flags]
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING", **(env or {})})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            return server, url
        except OSError:
            if server.poll() is not None or time.time() > deadline:
                server.kill()
                pytest.fail(f"the vLLM server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
