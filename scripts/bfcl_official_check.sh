#!/usr/bin/env bash
# Score answers to BFCL questions with BFCL's own checker beside distill's, and say how often the two agree.
#
#   bash scripts/bfcl_official_check.sh RUN_DIR/eval/eval.json [EVALUATION]   # a run's greedy answers (its bfcl_calls)
#   bash scripts/bfcl_official_check.sh ANSWERS.jsonl                         # {"id", "text"} lines
#   bash scripts/bfcl_official_check.sh --examples                            # hand-made answers to real questions
#
# BFCL's checker imports every API client BFCL supports: the package bfcl-eval with its dependencies (numpy pinned to
# 1.26.4, and soundfile, which it imports without declaring it), installed in an environment of its own, never
# distill's: $BFCL_VENV (default ~/.cache/distill/bfcl-venv), made on the first run (minutes) and reused after, with
# torch's CPU build (scripts/install_cpu_torch.sh: its sentence-transformers would otherwise pull the CUDA build).
# distill's side runs in the active environment (distill, and bfcl-eval installed --no-deps for the data). Prints
# both scores, the agreement and every answer they disagree on; writes the numbers to $BFCL_REPORT, by default
# bfcl_agreement.json beside the answers. BFCL_INSTALL=0: never install; when the environment is missing, say so and
# exit 3 (what benchmarks/bfcl.py --official does).
set -euo pipefail
if [ $# -lt 1 ]; then sed -n '2,7p' "$0"; exit 2; fi
if [ "$1" = "--examples" ]; then
  source="" report="${BFCL_REPORT:-}"
else
  source="$(realpath "$1")" report="${BFCL_REPORT:-$(dirname "$(realpath "$1")")/bfcl_agreement.json}"
fi
evaluation="${2:-}"
cd "$(dirname "$0")/.."
venv="${BFCL_VENV:-$HOME/.cache/distill/bfcl-venv}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import bfcl_eval.eval_checker.eval_runner" 2>/dev/null; then
  if [ "${BFCL_INSTALL:-1}" = "0" ]; then
    echo "BFCL's checker is not installed in $venv; not installing it (BFCL_INSTALL=0): run" \
         "scripts/bfcl_official_check.sh --examples once without BFCL_INSTALL to install it (minutes, about 2 GB)" >&2
    exit 3
  fi
  echo "== installing BFCL's checker into $venv (bfcl-eval==2026.3.23 with its dependencies)"
  python -m venv "$venv"
  bash scripts/install_cpu_torch.sh "$venv/bin/python"
  "$venv/bin/pip" install "torch==2.13.0" "bfcl-eval==2026.3.23" soundfile
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
data="$("$venv/bin/python" -c 'import bfcl_eval, os; print(os.path.join(os.path.dirname(bfcl_eval.__file__), "data"))')"
if [ -z "$source" ]; then
  python scripts/bfcl_agreement.py examples --data "$data" > "$work/answers.jsonl"
else
  python scripts/bfcl_agreement.py answers "$source" ${evaluation:+"$evaluation"} > "$work/answers.jsonl"
fi
"$venv/bin/python" scripts/bfcl_official_score.py "$work/answers.jsonl" > "$work/official.jsonl"
python scripts/bfcl_agreement.py compare "$work/answers.jsonl" "$work/official.jsonl" --data "$data" ${report:+--json "$report"}
