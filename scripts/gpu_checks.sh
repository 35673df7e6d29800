#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one self-contained command that ends within 540 s (the device tool allows 600 s
# a command), run from the repository root of the GPU machine; docs/throughput.md quotes what it printed and on which
# card. Every log and JSON lands in OUT, which the device tool brings back ($OUT there).
#
#   scripts/gpu_bundle.sh                              # here, first: build/gpu-bundle (carry it: carry=["build/gpu-bundle"])
#   bash scripts/gpu_checks.sh OUT                     # there: OUT is "$OUT"
#   bash scripts/gpu_checks.sh --rehearse OUT          # here: the same steps on the CPU, in .venv-device, CUDA's choices
#   bash scripts/gpu_checks.sh --plan OUT              # the GPU run's steps and time limits, one a line, nothing run
#
# 0. the bundle (GPU_BUNDLE, default build/gpu-bundle; with --rehearse one is built for this Python) installed with
#    no network into OUT/site (pip --target, on PYTHONPATH), then every module the steps import checked, one line each;
#    without a CUDA device (and without --rehearse): one line saying so, exit status 2, nothing else run;
# 1. benchmarks/vs_trl.py --device cuda: issue 48's measurement, trials A C B B C A (TRL second), its own --deadline-s
#    (260 s from its start) stopping the trials in time to print the table and the goal lines, OUT/vs_trl.json;
# 2. benchmarks/decode_step.py --device cuda: the decode step against its memory floor, one compiled step per mode;
# 3. the gpu-marked tests: the loss core's (fused_policy_loss, token_logprobs, the casts in place) and the trainer's
#    (a tiny run under bf16 autocast: the static cache, the compiled decode step, the decoding copy on CUDA);
# 4. only while the time allows (the elapsed time + its limit within 540 s): benchmarks/fused_head.py at issue 48's
#    goal sizes, bf16, V = 151,936, 8 x 2048, H = 1024 then 4096 (fused_once against the floors).
# Each step has its own time limit, so a slow one leaves the later ones their time. The limits of steps 0-3 add up to
# 540 s: torch and CUDA 20 + install 20 + imports 35 + nvidia-smi 5 + vs_trl 280 + decode_step 70 + core tests 40 +
# trainer test 70 (--plan lists them; a test adds them up).
# The exit status is the first step's that failed (124: its time ran out), 0 when none did; the last lines list each,
# and OUT/gpu_checks.json holds them (name, exit status, seconds, log).
# With --rehearse (PYTHON default .venv-device/bin/python, from scripts/device_env.sh: torch 2.11, transformers 5.17 on
# Python 3.11, where the image has 3.12) the same steps run on the CPU with DFPO_CUDA_DEFAULTS=1 (a static cache, the
# decode step compiled, bf16 autocast over float32 weights, the bf16 head) at a tiny shape; the gpu-marked tests skip
# there, and the device-versions tests run in their place.
# -P: the repository root stays off sys.path, so its dfpo/ folder (the CLI alone) cannot hide the installed package.
set -uo pipefail
rehearse=0
plan=0
case "${1:-}" in
  --rehearse) rehearse=1; shift ;;
  --plan) plan=1; shift ;;
esac
out=${1:?usage: bash scripts/gpu_checks.sh [--rehearse | --plan] OUT}
case "$out" in /*) ;; *) out=$PWD/$out ;; esac  # OUT as the caller named it, before the cd
cd "$(dirname "$0")/.."
budget=540
if [ "$rehearse" -eq 1 ]; then
  py=${PYTHON:-.venv-device/bin/python}
  export DFPO_CUDA_DEFAULTS=1
else
  py=${PYTHON:-python3}
fi

status=0
summary=()
json=()
record() { # record NAME EXIT SECONDS LOG: one line for the summary, one JSON row, the first failure's status for the exit
  summary+=("$1: exit $2, $3 s (log $4)")
  json+=("{\"step\": \"$1\", \"exit\": $2, \"seconds\": $3, \"log\": \"$4\"}")
  if [ "$status" -eq 0 ] && [ "$2" -ne 0 ]; then status=$2; fi
}
step() { # step NAME LIMIT LOG COMMAND...: runs COMMAND within LIMIT seconds, its output shown and kept in OUT/LOG
  local name=$1 limit=$2 log=$3 t0=$SECONDS
  shift 3
  if [ "$plan" -eq 1 ]; then
    echo "plan: $limit s $name"
    return
  fi
  timeout "$limit" "$@" > >(tee "$out/$log") 2>&1
  local rc=$?
  record "$name" "$rc" "$((SECONDS - t0))" "$log"
}
finish() {
  [ "$plan" -eq 1 ] && exit 0
  printf 'gpu_checks: %s\n' "${summary[@]}"
  local IFS=,
  printf '{"rehearsal": %s, "exit": %s, "seconds": %s, "steps": [%s]}\n' \
    "$([ "$rehearse" -eq 1 ] && echo true || echo false)" "$status" "$SECONDS" "${json[*]}" >"$out/gpu_checks.json"
  exit "$status"
}

if [ "$plan" -eq 1 ]; then
  echo "plan: 20 s torch and CUDA"
else
  timeout 20 "$py" -c "
import sys
try:
    import torch
except ImportError as e:
    print(f'no torch: {sys.executable} cannot import it ({e}); set PYTHON to the environment that has torch', file=sys.stderr)
    sys.exit(2)
if not torch.cuda.is_available() and not $rehearse:
    print(f'no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build {torch.version.cuda}); '
          'scripts/gpu_checks.sh needs a CUDA GPU (--rehearse runs its steps on the CPU)', file=sys.stderr)
    sys.exit(2)
"
  checked=$?
  if [ "$checked" -ne 0 ]; then
    [ "$checked" -eq 2 ] || echo "gpu_checks: the torch and CUDA check failed (exit $checked)" >&2
    exit 2
  fi
fi

if [ "$plan" -eq 0 ]; then
  mkdir -p "$out"  # only once the checks above passed: a machine without CUDA is left as it was
fi

# 0. The bundle: no network on the GPU machine, so every wheel comes from it.
bundle=${GPU_BUNDLE:-build/gpu-bundle}
if [ "$rehearse" -eq 1 ] && [ -z "${GPU_BUNDLE:-}" ]; then
  bundle=$out/bundle
  version=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  step "bundle for Python $version" 120 bundle.log scripts/gpu_bundle.sh --python-version "$version" "$bundle"
fi
if [ "$plan" -eq 0 ] && ! ls "$bundle"/*.whl >/dev/null 2>&1; then
  echo "gpu_checks: no wheels in $bundle; run scripts/gpu_bundle.sh here and carry build/gpu-bundle (or set GPU_BUNDLE)" >&2
  record "bundle" 1 0 "-"
  finish
fi
step "install the bundle" 20 install.log "$py" -m pip install -q --no-index --no-deps --target "$out/site" "$bundle"/*.whl
export PYTHONPATH="$out/site${PYTHONPATH:+:$PYTHONPATH}"
step "imports" 35 imports.log "$py" -P -c "
import importlib, sys
missing = []
for name in ('torch', 'transformers', 'tomli_w', 'dfpo.trainer.train', 'trl', 'datasets', 'math_verify', 'pytest', 'hypothesis'):
    try:
        importlib.import_module(name)
    except Exception as err:
        missing.append(name)
        print(f'gpu_checks: {name} does not import ({type(err).__name__}: {err})')
import torch, transformers, dfpo
print('Python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'dfpo from', dfpo.__file__, 'CUDA' if torch.cuda.is_available() else 'CPU')
sys.exit(1 if missing else 0)
"
if [ "$rehearse" -eq 0 ]; then
  step "nvidia-smi" 5 nvidia_smi.log nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi

# 1-3. The measurements, then the tests.
if [ "$rehearse" -eq 0 ]; then
  step "vs_trl" 280 vs_trl.log "$py" -P benchmarks/vs_trl.py --device cuda --json "$out/vs_trl.json"
  step "decode_step" 70 decode_step.log "$py" -P benchmarks/decode_step.py --device cuda
  step "core gpu tests" 40 pytest_core_gpu.log "$py" -P -m pytest -q -p no:cacheprovider -m gpu tests/core/test_fused.py \
    tests/core/test_logprobs.py tests/core/test_cast_in_place.py
  step "trainer gpu test" 70 pytest_trainer_gpu.log "$py" -P -m pytest -q -p no:cacheprovider -m gpu tests/trainer/test_llm_e2e.py
else
  step "vs_trl" 280 vs_trl.log "$py" -P benchmarks/vs_trl.py --device cpu --shape tiny --max-new 4 --steps 2 --trials 3 \
    --threads 1 --deadline-s 260 --json "$out/vs_trl.json"
  step "decode_step" 75 decode_step.log "$py" -P benchmarks/decode_step.py --device cpu --rows 4 --prompt-len 8 --short 2 \
    --long 18
  step "core gpu tests" 40 pytest_core_gpu.log "$py" -P -m pytest -q -p no:cacheprovider -m gpu tests/core/test_fused.py \
    tests/core/test_logprobs.py tests/core/test_cast_in_place.py
  step "device-versions tests" 120 pytest_device.log "$py" -P -m pytest -q -p no:cacheprovider \
    tests/trainer/test_device_versions.py
fi

# 4. Only in the time left.
if [ "$rehearse" -eq 0 ]; then
  modes=(floor floor_softmax floor_autograd fused_once)
  for hidden in 1024 4096; do
    if [ "$plan" -eq 1 ]; then
      echo "plan: 40 s fused_head H=$hidden, only while the $budget s budget allows it"
      continue
    fi
    if [ $((SECONDS + 40)) -gt "$budget" ]; then
      echo "gpu_checks: fused_head H=$hidden not run: $SECONDS s gone, its 40 s would pass the $budget s budget"
      continue
    fi
    step "fused_head H=$hidden" 40 "fused_head_bf16_h$hidden.log" "$py" -P benchmarks/fused_head.py --device cuda \
      --dtype bfloat16 --sizes 8x2048 --vocab 151936 --hidden "$hidden" --rounds 2 --repeats 5 --modes "${modes[@]}"
  done
fi
finish
