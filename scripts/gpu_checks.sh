#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one command that ends within 8 minutes, run from the repository root of a machine
# with dfpo and TRL importable; docs/throughput.md quotes what it printed and on which card.
#
#   bash scripts/gpu_checks.sh [LOG_DIR]        # logs land in LOG_DIR (default gpu-checks/), one per step
#
# 0. without a CUDA device: one line saying so, exit status 2, nothing else run;
# 1. benchmarks/vs_trl.py --device cuda: issue 48's measurement (a Qwen3-0.6B-shaped model, dfpo with the sampler's
#    log-probs, dfpo recomputing them, TRL's GRPOTrainer, alternated in fresh processes; its own --deadline-s, 210 s
#    from its start, stops the trials in time to print the table and the goal lines);
# 2. benchmarks/decode_step.py --device cuda: the rollout's decode step against its memory floor;
# 3. the gpu-marked tests of the loss core (fused_policy_loss and token_logprobs against the full-logits path, on CUDA;
#    a half-precision head's casts in place against .to copies);
# 4. benchmarks/fused_head.py on the GPU at issue 48's goal sizes, bfloat16 h and W (a bf16 model's head), V = 151,936,
#    8 x 2048, at H = 1024 (Qwen3-0.6B) and H = 4096 (Qwen3-8B), fused_once against both floors (the three matmuls in
#    reused blocks, and the issue's: h @ W.T forward + backward by autograd) and floor_softmax (whether the goal is
#    within reach of any path that writes the logits on this card). Shrunk to fit the 8 minutes: the default block
#    only, no Liger rows and no float32 step (their earlier figures are in docs/throughput.md);
# 5. the trainer's gpu-marked test (a tiny run under bf16 autocast), where the trainer's dependencies are installed.
# Each step has its own time limit, so a slow one leaves the later ones their time. The limits add up to 470 s:
#   CUDA check 15 + nvidia-smi 5 + vs_trl 235 + decode_step 60 + core tests 40 + fused_head 40 + 40 + trainer test 35.
# The exit status is the first step's that failed (124: its time ran out), 0 when none did; the last lines list each.
# -P: the repository root stays off sys.path, so its dfpo/ folder (the CLI alone) cannot hide the installed package.
set -uo pipefail
log=${1:-gpu-checks}
py=${PYTHON:-python3}
mkdir -p "$log"

timeout 15 $py -c "
import sys
try:
    import torch
except ImportError as e:
    print(f'no torch: {sys.executable} cannot import it ({e}); set PYTHON to the environment that has dfpo', file=sys.stderr)
    sys.exit(2)
if not torch.cuda.is_available():
    print(f'no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build {torch.version.cuda}); '
          'scripts/gpu_checks.sh needs a CUDA GPU', file=sys.stderr)
    sys.exit(2)
print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())
"
cuda=$?
if [ "$cuda" -ne 0 ]; then
    [ "$cuda" -eq 2 ] || echo "gpu_checks: the CUDA check failed (exit $cuda)" >&2
    exit 2
fi
timeout 5 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

status=0
summary=()
record() { # record NAME EXIT: one line for the summary, and the first failure's status for the exit
    summary+=("$1: exit $2")
    if [ "$status" -eq 0 ] && [ "$2" -ne 0 ]; then status=$2; fi
}

timeout 235 $py benchmarks/vs_trl.py --device cuda 2>&1 | tee "$log/vs_trl.log"
record "vs_trl (log $log/vs_trl.log)" "${PIPESTATUS[0]}"

timeout 60 $py benchmarks/decode_step.py --device cuda 2>&1 | tee "$log/decode_step.log"
record "decode_step (log $log/decode_step.log)" "${PIPESTATUS[0]}"

timeout 40 $py -P -m pytest -q -p no:cacheprovider -m gpu tests/core/test_fused.py tests/core/test_logprobs.py \
    tests/core/test_cast_in_place.py 2>&1 | tee "$log/pytest_core_gpu.log"
record "core gpu tests (log $log/pytest_core_gpu.log)" "${PIPESTATUS[0]}"

modes=(floor floor_softmax floor_autograd fused_once)
for hidden in 1024 4096; do
    timeout 40 $py benchmarks/fused_head.py --device cuda --dtype bfloat16 --sizes 8x2048 --vocab 151936 --hidden "$hidden" \
        --rounds 2 --repeats 5 --modes "${modes[@]}" 2>&1 | tee "$log/fused_head_bf16_h$hidden.log"
    record "fused_head H=$hidden (log $log/fused_head_bf16_h$hidden.log)" "${PIPESTATUS[0]}"
done

timeout 35 $py -P -m pytest -q -p no:cacheprovider -m gpu tests/trainer/test_llm_e2e.py 2>&1 | tail -5 | tee "$log/pytest_trainer_gpu.log"
record "trainer gpu test (log $log/pytest_trainer_gpu.log)" "${PIPESTATUS[0]}"

printf 'gpu_checks: %s\n' "${summary[@]}"
exit "$status"
