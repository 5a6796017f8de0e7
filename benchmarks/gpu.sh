#!/usr/bin/env bash
# The GPU checks, in one prepared script (estimated 6 to 9 minutes on one H200, never run there; the bound is 10):
#   1. the default recipe, 20 steps, bf16 autocast on CUDA (benchmarks/step.py): s/step, its parts, peak GPU memory;
#   2. the distillation loss in bf16 at N = 8192, V = 49152 (benchmarks/loss.py): dense vs distill's chunked loss vs
#      TRL's chunked kernel vs Liger-Kernel's fused linear JSD, time and peak GPU memory, beta 0 / 0.5 / 1;
#   3. an on-policy step against TRL's DistillationTrainer, bf16 on CUDA (benchmarks/step.py --vs-trl): the
#      step-time target of 0.6x TRL's, measured where it can be met (on 2 CPU cores it is below the floor);
#   4. the same with both sampling through vLLM colocated (benchmarks/step.py --vs-trl --vllm), where vLLM imports;
#   5. asynchronous rollouts (benchmarks/async_rollouts.py): on_policy at max_staleness 0, 1 and 2, the student
#      sampling in a worker thread on a CUDA stream of its own, bf16: seconds per step, waiting, generation, training.
# FSDP is not run: distill shards over processes, NCCL takes one process per GPU, and one process has nothing to
# shard (distill refuses `fsdp: true` there). FSDP on CUDA needs a machine with 2 or more GPUs.
#
# The device machine has no internet and takes 64 MiB of files per call, so first, here:
#     bash benchmarks/gpu_bundle.sh        # .gpu/: wheels it lacks (gguf, trl, liger-kernel, datasets) and the
#                                          # default teacher's config + tokenizer (its 94 MB GGUF cannot travel)
# then, through the device tool: run(command="bash benchmarks/gpu.sh", carry=[".gpu"], timeout_s=600); if the five
# checks do not fit one call, run(command="GPU_CHECKS='1 2 3' bash benchmarks/gpu.sh", ...) and then GPU_CHECKS='4 5'.
# The teacher there has the default teacher's shape and seeded random weights (benchmarks/gpu_teacher.py):
# the compute of the default recipe, not its answers. Results go to $OUT (the device tool's folder) or
# benchmarks/results/gpu/.
#
#     bash benchmarks/gpu.sh --smoke       # here, on CPU, tiny sizes: checks the script itself, not the GPU
# Each check runs under its own time limit, and a failed one is reported and skipped: one device call runs them all.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

smoke=0
if [ "${1:-}" = "--smoke" ]; then smoke=1; fi
results=${OUT:-benchmarks/results/gpu}
mkdir -p "$results"
python=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

if [ -d .gpu/wheels ] && [ $smoke = 0 ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site \
    .gpu/wheels/*.whl || exit 1
  export PYTHONPATH="/tmp/gpu-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT  # the materialized teacher (half a GB)
teacher_args=()
if [ -f .gpu/teacher/config.json ]; then
  "$python" benchmarks/gpu_teacher.py materialize .gpu/teacher "$scratch/teacher" || exit 1
  teacher_args=(--teacher "$scratch/teacher")
fi

failed=()
only=" ${GPU_CHECKS:-1 2 3 4 5} "  # GPU_CHECKS="5" runs check 5 alone (one device call is 600 s at most)
want() { [[ "$only" == *" $1 "* ]]; }
check() {  # check NAME SECONDS LOG COMMAND...: run it under a time limit, its output teed to LOG; a failure is noted
  local name=$1 limit=$2 log=$3
  shift 3
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  if [ "$status" != 0 ]; then
    echo "== $name FAILED (exit $status; 124 is the ${limit} s limit)"
    failed+=("$name")
  fi
}

if [ $smoke = 1 ]; then
  device=cpu; steps=(--steps 1 --warmup 0); loss_shape=(--n 128 --vocab 4096 --hidden 64 --repeats 2)
  versus=(--steps 1 --warmup 0 --rounds 1)
else
  device=cuda; steps=(--steps 20 --warmup 2); loss_shape=(--n 8192 --repeats 5); versus=(--steps 4 --warmup 1 --rounds 2)
  nvidia-smi -L
fi
# What runs there, and whether each compared library imports (a missing one costs its column, not the run).
"$python" - <<'PY' 2>&1 | tee "$results/versions.log"
import importlib
import torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}), transformers {transformers.__version__}")
for name in ("distill", "gguf", "pyarrow", "datasets", "trl", "liger_kernel.chunked_loss", "accelerate"):
    try:
        module = importlib.import_module(name)
        print(f"  {name} {getattr(module, '__version__', '')}")
    except Exception as error:
        print(f"  {name} does not import: {type(error).__name__}: {error}")
PY

# 1. The default recipe starts off-policy (lmbda 0 for its first 54 steps: dataset and teacher completions), so these
# steps time its first phase; the random-weight teacher rarely ends a completion early, so they run to full length.
want 1 && check "1. the default recipe, bf16, ${steps[*]}" 140 "$results/step_bf16.log" \
  "$python" benchmarks/step.py --mode default --device "$device" --dtype bfloat16 "${steps[@]}" "${teacher_args[@]}" \
  --out "$results/step_bf16.json"
want 2 && check "2. the distillation loss, bf16" 220 "$results/loss_bf16.log" \
  "$python" benchmarks/loss.py --device "$device" --dtype bfloat16 --beta 0 0.5 1 "${loss_shape[@]}" \
  --out "$results/loss_bf16.json"
want 3 && check "3. an on-policy step vs TRL, bf16" 160 "$results/step_vs_trl_bf16.log" \
  "$python" benchmarks/step.py --vs-trl --device "$device" --dtype bfloat16 "${versus[@]}" "${teacher_args[@]}" \
  --out "$results/step_vs_trl_bf16.json"
# 4. The same with both sampling through vLLM colocated (distill: generation_engine vllm; TRL: use_vllm, colocate).
# vLLM is not among the bundled wheels (its CUDA wheel is gigabytes): the check runs where the machine has it.
if ! want 4; then
  :
elif [ $smoke = 1 ]; then
  echo "== 4. skipped in --smoke (vLLM on CPU is checked by scripts/install_vllm_cpu.sh and tests/vllm)"
elif "$python" -c "import vllm" 2>/dev/null; then
  check "4. an on-policy step vs TRL, both with vLLM colocated, bf16" 200 "$results/step_vs_trl_vllm_bf16.log" \
    "$python" benchmarks/step.py --vs-trl --vllm --device "$device" --dtype bfloat16 "${versus[@]}" "${teacher_args[@]}" \
    --out "$results/step_vs_trl_vllm_bf16.json"
else
  echo "== 4. skipped: vLLM does not import on this machine"
fi

# 5. Asynchronous rollouts, in-process engine (a vLLM server would need a second GPU or a share of this one).
# Each arm is a fresh process (models loaded, then an evaluation): about 1.5 minutes each there, so run it on its own
# (GPU_CHECKS=5). The smoke run checks the script in float32 (bf16 autocast on a CPU is slow).
if [ $smoke = 1 ]; then
  async_shape=(--steps 2 --warmup 1 --eval-prompts 2 --staleness 0 1 --dtype float32)
else
  async_shape=(--steps 12 --warmup 2 --eval-prompts 8 --dtype bfloat16)
fi
want 5 && check "5. asynchronous rollouts, max_staleness 0 / 1 / 2" 420 "$results/async_rollouts_bf16.log" \
  "$python" benchmarks/async_rollouts.py --device "$device" "${async_shape[@]}" "${teacher_args[@]}" \
  --out "$results/async_rollouts_bf16.json"

if [ ${#failed[@]} -gt 0 ]; then
  echo "== done with failures: ${failed[*]} (results: $results)"
  exit 1
fi
echo "== done: $results"
