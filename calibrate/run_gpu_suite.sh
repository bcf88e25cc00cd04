#!/usr/bin/env bash
# memest's CUDA calibration in one go: the GPU tests, the suites, the constants, the accuracy report.
#
#   calibrate/run_gpu_suite.sh [SUITE ...]        default: gpu-smoke (a few minutes on one 80 GB GPU)
#   calibrate/run_gpu_suite.sh gpu-smoke gpu-80gb  the full single-GPU suite (25-40 minutes)
#   calibrate/run_gpu_suite.sh gpu-multi           2 and 8 GPUs of one node
#
# Environment:
#   PYTHON         interpreter with a CUDA build of torch (default: .venv/bin/python if it sees a GPU, else python3)
#   CASE_TIMEOUT   seconds before a case is stopped (default 600)
#   OUT            if set, the records, constants and reports are also copied there (a device runner's $OUT)
#   COMMIT=1       commit calibrate/results, memest/data/calibrated.json, benchmarks/accuracy.md, README.md
#
# Needs torch (CUDA), transformers, typer, rich, huggingface_hub; peft for LoRA cases, bitsandbytes for
# QLoRA / 8-bit optimizer cases, nvidia-ml-py for NVML figures (device and per-process used). Runs offline:
# models are built from the configs in memest's catalog with random weights. Each case appends one line to
# calibrate/results/<device>.jsonl as soon as it finishes, so a run cut short keeps what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
SUITES=("$@")
[ ${#SUITES[@]} -eq 0 ] && SUITES=(gpu-smoke)
CASE_TIMEOUT=${CASE_TIMEOUT:-600}

has_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if [ -z "${PYTHON:-}" ]; then
  for candidate in .venv/bin/python python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && has_cuda "$candidate"; then PYTHON=$candidate; break; fi
  done
fi
if [ -z "${PYTHON:-}" ] || ! has_cuda "$PYTHON"; then
  echo "no Python here sees a CUDA device (torch.cuda.is_available() is False); set PYTHON to one that does" >&2
  exit 2
fi
echo "== python: $PYTHON"
"$PYTHON" - <<'PY'
import importlib.util, torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
missing = [m for m in ("typer", "rich", "transformers", "huggingface_hub") if importlib.util.find_spec(m) is None]
if missing:
    raise SystemExit(f"missing required modules: {', '.join(missing)} (pip install {' '.join(missing)})")
for module, what in (("peft", "LoRA/QLoRA cases"), ("bitsandbytes", "QLoRA and 8-bit optimizer cases"),
                     ("pynvml", "NVML figures (pip install nvidia-ml-py)"), ("pytest", "the GPU tests")):
    if importlib.util.find_spec(module) is None:
        print(f"note: {module} not installed: {what} will fail or be skipped")
PY
[ $? -eq 0 ] || exit 2
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv 2>/dev/null || true

status=0
if "$PYTHON" -c 'import pytest' 2>/dev/null; then
  echo "== GPU tests"
  "$PYTHON" -m pytest -q -m gpu tests/test_calibrate_gpu.py || status=1
fi
for suite in "${SUITES[@]}"; do
  echo "== suite $suite"
  "$PYTHON" -m memest calibrate --suite "$suite" --case-timeout "$CASE_TIMEOUT" || status=1
done
echo "== constants and accuracy report"
"$PYTHON" calibrate/update_constants.py || status=1
"$PYTHON" benchmarks/accuracy.py --readme || status=1

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT/calibrate/results" "$OUT/memest/data" "$OUT/benchmarks"
  cp calibrate/results/*.jsonl "$OUT/calibrate/results/" 2>/dev/null
  cp memest/data/calibrated.json "$OUT/memest/data/"
  cp benchmarks/accuracy.md "$OUT/benchmarks/"
  cp README.md "$OUT/"
  echo "copied the results to $OUT"
fi
if [ "${COMMIT:-0}" = 1 ] && git rev-parse --git-dir >/dev/null 2>&1; then
  git add calibrate/results memest/data/calibrated.json benchmarks/accuracy.md README.md
  git commit -m "calibrate: CUDA records ($(IFS=,; echo "${SUITES[*]}")) on $("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))')" || true
fi
exit $status
