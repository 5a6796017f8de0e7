#!/usr/bin/env bash
# Prepares .gpu/ for benchmarks/gpu.sh on the device machine (Python 3.12, x86-64, no internet; it has torch,
# transformers, accelerate, peft, pandas, pyarrow, xxhash and fsspec, and lacks the packages below):
#   .gpu/wheels/   gguf, trl, liger-kernel, datasets, dill, multiprocess (--no-deps, for CPython 3.12 on manylinux)
#   .gpu/teacher/  the default teacher's config and tokenizer (benchmarks/gpu_teacher.py export)
# and adds .gpu/ to .git/info/exclude. Writes only inside .gpu/, which it creates; refuses an existing one.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -e .gpu ]; then
  echo ".gpu exists: remove it (rm -r .gpu) to build it again" >&2
  exit 1
fi
exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
mkdir -p .gpu/wheels
platforms=()
for n in 28 27 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${platforms[@]}" \
  -d .gpu/wheels gguf==0.19.0 trl==1.16.0 liger-kernel==0.8.5 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
python benchmarks/gpu_teacher.py export .gpu/teacher
du -sh .gpu
echo 'then: run(command="bash benchmarks/gpu.sh", carry=[".gpu"], timeout_s=600)'
