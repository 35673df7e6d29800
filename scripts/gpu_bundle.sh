#!/usr/bin/env bash
# The wheels the GPU machine's image lacks, for its Python, and dfpo's own wheel, in one folder that the device tool
# carries (git-ignored: build/ is), so that scripts/gpu_checks.sh installs them there with no network.
#
#   scripts/gpu_bundle.sh [--python-version X.Y] [DIR]     # default 3.12 (the image's), build/gpu-bundle
#
# The image (docs: shared/notes/environment.md) has torch 2.11, transformers 5.17, triton, peft, accelerate, tokenizers,
# safetensors, hypothesis, sympy and pytest; it lacks what is downloaded below (pure-Python wheels, or built for the
# image's Python: multiprocess). --python-version 3.11 builds the same bundle for this machine's Python, which
# `scripts/gpu_checks.sh --rehearse` installs into the device-versions environment. The folder is refused above 60 MiB
# (the device tool carries 64 MiB in all); BUNDLE.txt in it names the Python, the commit and the files.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=3.12
dir=build/gpu-bundle
while [ $# -gt 0 ]; do
  case "$1" in
    --python-version) python_version=${2:?--python-version takes X.Y}; shift 2 ;;
    -*) echo "gpu_bundle: unknown option $1; usage: scripts/gpu_bundle.sh [--python-version X.Y] [DIR]" >&2; exit 2 ;;
    *) dir=$1; shift ;;
  esac
done
pip=(python3 -m pip)
[ -x .venv/bin/pip ] && pip=(.venv/bin/pip)
missing=(
  tomli-w==1.2.0 trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 math-verify==0.9.0
  latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2 liger-kernel==0.8.5
)
rm -rf "$dir"
mkdir -p "$dir"
"${pip[@]}" download -q --python-version "$python_version" --only-binary=:all: --no-deps -d "$dir" "${missing[@]}"
"${pip[@]}" wheel -q --no-deps -w "$dir" .  # dfpo itself, pure Python
size=$(du -sm "$dir" | cut -f1)
if [ "$size" -gt 60 ]; then
  echo "gpu_bundle: $dir holds $size MiB, more than the 60 MiB the device tool carries beside the tree; drop a wheel" >&2
  exit 1
fi
{
  echo "python $python_version"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  (cd "$dir" && ls -1 ./*.whl | sed 's|^\./||')
} > "$dir/BUNDLE.txt"
echo "gpu_bundle: $(ls "$dir"/*.whl | wc -l) wheels for Python $python_version in $dir ($size MiB)"
