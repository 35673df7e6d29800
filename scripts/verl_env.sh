#!/usr/bin/env bash
# Build the separate environment verl needs (verl 0.9 pins transformers<5.11 and brings ray).
# Usage: scripts/verl_env.sh [ENV_DIR] (default .venv-verl). Then: ENV_DIR/bin/python scripts/verl_check.py
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${1:-.venv-verl}
python3 -m venv "$env_dir"
"$env_dir/bin/pip" install -q -c constraints.txt verl
"$env_dir/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
"$env_dir/bin/pip" install -q --no-deps -e .
"$env_dir/bin/python" -c "import verl, torch, transformers, dfpo; print('verl', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
