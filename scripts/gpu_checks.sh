#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one command, run from the repository root of a machine with dfpo (and, for the
# Liger rows, liger-kernel) importable; docs/throughput.md quotes what it printed and on which card.
#
#   bash scripts/gpu_checks.sh [LOG_DIR]        # logs land in LOG_DIR (default gpu-checks/), one per step
#
# 1. the gpu-marked tests of the loss core (fused_policy_loss and token_logprobs against the full-logits path, on CUDA;
#    a half-precision head's casts in place against .to copies);
# 2. benchmarks/fused_head.py on the GPU at the four sizes, bfloat16 h and W (a bf16 model's head) in blocks of
#    256, 384 and 512 positions side by side (the block that keeps bf16 under Liger's memory, and what it costs), then
#    float32 at the default block; both floors run (the three matmuls in reused blocks, and the issue's: h @ W.T forward
#    + backward by autograd), and the goal lines read each mode against both; floor_softmax (the floor with a softmax
#    over each block) says whether the goal is within reach of any path that writes the logits on this card;
# 3. the trainer's gpu-marked test (a tiny run under bf16 autocast), where the trainer's dependencies are installed
#    (the device image lacks tomli-w alone: carry its wheel beside liger-kernel's).
# Each step has its own time limit, so a slow one leaves the later ones their time; the exit status is the tests'.
# -P: the repository root stays off sys.path, so its dfpo/ folder (the CLI alone) cannot hide the installed package.
set -uo pipefail
log=${1:-gpu-checks}
py=${PYTHON:-python3}
mkdir -p "$log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$py -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
$py -c "import liger_kernel, importlib.metadata as m; print('liger-kernel', m.version('liger-kernel'))" || echo "liger-kernel: not importable, its rows are skipped"

timeout 60 $py -P -m pytest -q -p no:cacheprovider -m gpu tests/core/test_fused.py tests/core/test_logprobs.py \
    tests/core/test_cast_in_place.py 2>&1 | tee "$log/pytest_core_gpu.log"
status=${PIPESTATUS[0]}

modes=(floor floor_softmax floor_autograd chunked fused_once liger_compiled)
timeout 200 $py benchmarks/fused_head.py --device cuda --dtype bfloat16 --rounds 2 --repeats 5 --modes "${modes[@]}" \
    --chunk 256 384 512 2>&1 | tee "$log/fused_head_bf16.log"
timeout 90 $py benchmarks/fused_head.py --device cuda --dtype float32 --rounds 2 --repeats 5 --modes "${modes[@]}" 2>&1 |
    tee "$log/fused_head_fp32.log"

timeout 40 $py -P -m pytest -q -p no:cacheprovider -m gpu tests/trainer/test_llm_e2e.py 2>&1 | tail -5 | tee "$log/pytest_trainer_gpu.log"
exit "$status"
