#!/usr/bin/env bash
# Build the environment with the GPU image's versions (torch 2.11.0, transformers 5.17.0), in which CI runs the decode,
# sampler and head-dtype tests and a tiny training step with the CUDA defaults forced on the CPU (DFPO_CUDA_DEFAULTS=1),
# and in which `bash scripts/gpu_checks.sh --rehearse OUT` rehearses the GPU machine's checks.
#
#   scripts/device_env.sh [ENV_DIR]        # default .venv-device (git-ignored)
#
# What differs from the GPU image, and why:
# - Python: the image runs 3.12, this machine 3.11 (the only Python here): the same packages, built for 3.11.
# - torch: the registry serves no CPU build of torch 2.11.0 for Python 3.11, only the CUDA 13.0 build
#   (torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl, the image's own torch 2.11.0+cu130), and even its CPU library
#   (libtorch_cpu.so) links libcudart and libcupti, so it needs the CUDA libraries to import. They are installed; on a
#   machine without a GPU torch.cuda.is_available() is False and everything runs on the CPU. Left out, as a CPU never
#   loads them: triton (CUDA kernels), cuda-bindings, cusolver (CUDA linear algebra), nvrtc (runtime compilation), nvtx.
# - The versions are a lock (installed with --no-deps, no resolution): pip would otherwise add what is left out above,
#   and the image's other packages (peft, accelerate, ...) to whatever versions it resolved that day. pandas, pyarrow
#   and xxhash stand for what the image has and TRL's rehearsal needs; TRL itself comes from the bundle
#   (scripts/gpu_bundle.sh), as on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir=${1:-.venv-device}
lock=(
  # torch 2.11.0 (CUDA 13.0 build) and the CUDA libraries its shared libraries link against
  torch==2.11.0 cuda-pathfinder==1.9.1 nvidia-cublas==13.1.0.3 nvidia-cuda-cupti==13.0.85 nvidia-cuda-runtime==13.0.96
  nvidia-cudnn-cu13==9.19.0.56 nvidia-cufft==12.0.0.61 nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35
  nvidia-cusparse==12.6.3.3 nvidia-cusparselt-cu13==0.8.0 nvidia-nccl-cu13==2.28.9 nvidia-nvjitlink==13.0.88
  nvidia-nvshmem-cu13==3.4.5
  filelock==4.3.2 fsspec==2026.9.0 Jinja2==3.1.6 MarkupSafe==3.0.4 networkx==3.6.1 sympy==1.14.0 mpmath==1.3.0
  typing_extensions==4.16.0
  # transformers 5.17.0 and what it imports
  transformers==5.17.0 huggingface_hub==1.33.0 hf-xet==1.8.0 tokenizers==0.23.3 safetensors==0.8.0 regex==2026.12.2
  PyYAML==6.0.4 packaging==26.4 tqdm==4.70.1 numpy==2.4.6 httpx==0.29.0 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0
  idna==3.21 certifi==2026.10.19.post1 typer==0.29.2 click==8.5.1 rich==15.0.0 shellingham==1.5.4
  markdown-it-py==4.3.0 mdurl==0.1.2 Pygments==2.21.0 annotated-doc==0.0.7 pydantic==2.14.4 pydantic_core==2.50.5
  annotated-types==0.8.0 typing-inspection==0.4.5
  # the image's other packages, and dfpo's config writer (carried in the bundle on the GPU machine)
  accelerate==1.16.0 psutil==7.2.2 peft==0.21.2 hypothesis==6.170.27 sortedcontainers==2.4.0 pytest==9.2.0
  iniconfig==2.3.1 pluggy==1.7.0 tomli_w==1.2.0
  # what TRL and datasets import beside the bundle's wheels
  pandas==3.1.1 python-dateutil==4.0.0 tzdata==2026.6 pyarrow==26.0.1 xxhash==4.1.0 requests==2.34.2
  charset-normalizer==3.5.3 urllib3==2.8.0
)
python3 -m venv "$env_dir"
# uv installs the lock's 3 GB in about half a minute where pip took four and a half (it downloads in parallel).
"$env_dir/bin/pip" install -q uv==0.13.9
"$env_dir/bin/uv" pip install -q --no-deps --python "$env_dir/bin/python" "${lock[@]}"
"$env_dir/bin/pip" install -q --no-deps -e .
# Importing the trainer fails here, at build time, on a module still missing.
"$env_dir/bin/python" -c "
import sys, torch, transformers, dfpo.trainer.train
print('device env: Python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__,
      'CUDA available:', torch.cuda.is_available())"
