#!/usr/bin/env bash
# Downloads (here, with network) the wheels a GPU call carries: the device machine has torch 2.11
# (CUDA 13), triton, numpy, pyarrow, safetensors, transformers and sentencepiece, and no network.
#   .whl/          torchao (FP8 GEMMs: pi05_optimised, gr00t/dreamzero float8 switches)
#   .whl/encode/   diffusers and its importlib-metadata (datakit encode's VAE, bench_encode_gpu.py)
#   .whl/lerobot/  LeRobot 0.6.1 and the imports of its policies (the peer steps), --no-deps
# On the device: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade
#   --target /tmp/site .whl/*.whl [.whl/encode/*.whl] [.whl/lerobot/*.whl]; export PYTHONPATH=$PWD:/tmp/site
# (.whl/ is git-ignored: name it in the run's carry list.)
set -euo pipefail
cd "$(dirname "$0")/../.."
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
get() { dest=$1; shift; python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$dest" "$@" 2>&1 | grep -v "is ignored" || true; }
mkdir -p .whl/encode .whl/lerobot
get .whl torchao==0.17.0
get .whl/encode diffusers==0.42.1 importlib-metadata zipp
get .whl/lerobot lerobot==0.6.1 draccus mergedeep typing-inspect mypy-extensions einops gymnasium \
    cloudpickle farama-notifications dm-tree
# torchvision 0.26 is the release built for the device's torch 2.11 (PyPI's Linux wheel; LeRobot's
# policies import it)
get .whl/lerobot torchvision==0.26.0
ls -la .whl .whl/encode .whl/lerobot
