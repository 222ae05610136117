#!/usr/bin/env bash
# One device call: the script for the card that came (H.sh on an H200, A.sh otherwise; A=B.sh picks
# another), run from the tree's root with the torchao wheel, .whl/encode and .whl/lerobot carried
# (bench/gpu/fetch_gpu_wheels.sh). Each script writes at most 8 files under $OUT (the device's limit).
#   run: bash bench/gpu/calls/go.sh          carry: the torchao wheel, .whl/encode, .whl/lerobot
cd "$(dirname "$0")/../../.." || exit 2
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
    bash bench/gpu/calls/"${H:-H.sh}"
else
    bash bench/gpu/calls/"${A:-A.sh}"
fi
