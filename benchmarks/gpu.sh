#!/usr/bin/env bash
# The GPU checks, in one prepared script (estimated 5 to 7 minutes on one H200, never run there; the bound is 8):
#   1. the default recipe, 20 steps, bf16 autocast on CUDA (benchmarks/step.py): s/step, its parts, peak GPU memory;
#   2. the distillation loss in bf16 at N = 8192, V = 49152 (benchmarks/loss.py): dense vs distill's chunked loss vs
#      TRL's chunked kernel vs Liger-Kernel's fused linear JSD, time and peak GPU memory, beta 0 / 0.5 / 1;
#   3. an on-policy step against TRL's DistillationTrainer, bf16 on CUDA (benchmarks/step.py --vs-trl): the
#      step-time target of 0.6x TRL's, measured where it can be met (on 2 CPU cores it is below the floor).
# FSDP is not run: distill shards over processes, NCCL takes one process per GPU, and one process has nothing to
# shard (distill refuses `fsdp: true` there). FSDP on CUDA needs a machine with 2 or more GPUs.
#
# The device machine has no internet and takes 64 MiB of files per call, so first, here:
#     bash benchmarks/gpu_bundle.sh        # .gpu/: wheels it lacks (gguf, trl, liger-kernel, datasets) and the
#                                          # default teacher's config + tokenizer (its 94 MB GGUF cannot travel)
# then, through the device tool: run(command="bash benchmarks/gpu.sh", carry=[".gpu"], timeout_s=540).
# The teacher there has the default teacher's shape and seeded random weights (benchmarks/gpu_teacher.py):
# the compute of the default recipe, not its answers. Results go to $OUT (the device tool's folder) or
# benchmarks/results/gpu/.
#
#     bash benchmarks/gpu.sh --smoke       # here, on CPU, tiny sizes: checks the script itself, not the GPU
set -euo pipefail
cd "$(dirname "$0")/.."

smoke=0
if [ "${1:-}" = "--smoke" ]; then smoke=1; fi
results=${OUT:-benchmarks/results/gpu}
mkdir -p "$results"
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if [ -d .gpu/wheels ] && [ $smoke = 0 ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site .gpu/wheels/*.whl
  export PYTHONPATH="/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

teacher_args=()
if [ -f .gpu/teacher/config.json ]; then
  teacher_dir=$(mktemp -d)/teacher
  "$python" benchmarks/gpu_teacher.py materialize .gpu/teacher "$teacher_dir"
  teacher_args=(--teacher "$teacher_dir")
fi

if [ $smoke = 1 ]; then
  device=cpu; steps=(--steps 1 --warmup 0); loss_shape=(--n 128 --vocab 4096 --hidden 64 --repeats 2)
  versus=(--steps 1 --warmup 0 --rounds 1)
else
  device=cuda; steps=(--steps 20 --warmup 2); loss_shape=(--n 8192 --repeats 5); versus=(--steps 4 --warmup 1 --rounds 2)
  nvidia-smi -L || true
fi
"$python" - <<'PY'
import torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}), transformers {transformers.__version__}")
PY

echo "== 1. the default recipe, bf16, ${steps[*]}"
"$python" benchmarks/step.py --mode default --device "$device" --dtype bfloat16 "${steps[@]}" "${teacher_args[@]}" \
  --out "$results/step_bf16.json" 2>&1 | tee "$results/step_bf16.log"

echo "== 2. the distillation loss, bf16"
"$python" benchmarks/loss.py --device "$device" --dtype bfloat16 --beta 0 0.5 1 "${loss_shape[@]}" \
  --out "$results/loss_bf16.json" 2>&1 | tee "$results/loss_bf16.log"

echo "== 3. an on-policy step vs TRL, bf16"
"$python" benchmarks/step.py --vs-trl --device "$device" --dtype bfloat16 "${versus[@]}" "${teacher_args[@]}" \
  --out "$results/step_vs_trl_bf16.json" 2>&1 | tee "$results/step_vs_trl_bf16.log"

echo "== done: $results"
