#!/usr/bin/env bash
# Install torch 2.13.0's CPU build into the environment of the Python given (default: `python` on PATH), for the
# environments the scripts make of their own (vLLM's, BFCL's checker's). A version pin alone does not pick the CPU
# build: on Linux x86_64 PyPI serves torch's CUDA build, with several GB of nvidia-* packages. The CPU build
# (2.13.0+cpu) comes from where pip's own configuration already finds it (a wheel directory, a mirror), else from
# PyTorch's CPU wheel index ($TORCH_INDEX_URL to use another). Nothing happens when that build is installed already.
#
#   bash scripts/install_cpu_torch.sh [PYTHON]
set -euo pipefail
python="${1:-python}"
want="torch==2.13.0+cpu"
if "$python" -c "import importlib.metadata as m, sys; sys.exit(m.version('torch') != '2.13.0+cpu')" 2>/dev/null; then
  exit 0
fi
if "$python" -m pip install --dry-run --no-deps --quiet "$want" >/dev/null 2>&1; then
  "$python" -m pip install "$want"
else
  "$python" -m pip install "$want" --index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
fi
