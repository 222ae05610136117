#!/usr/bin/env bash
# Downloads (here, with network) the wheels a GPU call carries: the device machine has torch 2.11
# (CUDA 13), triton, numpy, pyarrow, safetensors, transformers and sentencepiece, and no network.
#   .whl/          torchao (FP8 GEMMs: pi05_optimised, gr00t/dreamzero float8 switches)
#   .whl/encode/   diffusers and its importlib-metadata (datakit encode's VAE, bench_encode_gpu.py)
#   .whl/lerobot/  LeRobot 0.6.1 and the imports of its policies (the peer steps), --no-deps
#   .whl/ldata/ + .whl/lrsite.tar.xz   what LeRobotDataset and lerobot-train add (datasets, pandas, PyAV,
#                  accelerate, ...): with the two above, one xz of a `pip install --target` tree (~51 MiB,
#                  under the device's 64 MiB carry) for bench/peers/bench_lerobot_train.py (issue 38). On the
#                  device it goes AFTER the device's own packages (a .pth), so their numpy/torch win:
#                    mkdir -p /tmp/lrsite && xz -dc .whl/lrsite.tar.xz | tar xf - -C /tmp/lrsite
#                    SITE=$(python3 -c 'import site,sysconfig; print(site.getusersitepackages() if site.ENABLE_USER_SITE else sysconfig.get_paths()["purelib"])')
#                    mkdir -p "$SITE" && echo /tmp/lrsite > "$SITE/zz_lrsite.pth"
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
# LeRobotDataset and lerobot-train (the device has torch, numpy, pyarrow, transformers and huggingface_hub);
# no OpenCV (60 MB): the bench stands an empty cv2 in for LeRobot's import
mkdir -p .whl/ldata
get .whl/ldata datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 xxhash pandas==2.3.3 python-dateutil pytz tzdata \
    accelerate==1.16.0 av==15.1.0 psutil termcolor pillow aiohttp aiosignal aiohappyeyeballs attrs frozenlist \
    multidict propcache yarl wrapt markdown-it-py mdurl six
tree=$(mktemp -d)
python3 -m pip install -q --no-deps --no-compile --ignore-requires-python "${PLAT[@]}" --target "$tree" \
    .whl/ldata/*.whl .whl/lerobot/*.whl .whl/encode/*.whl
rm -rf "$tree/pandas/tests" "$tree/tests" "$tree/examples"
find "$tree" -name __pycache__ -type d -prune -exec rm -rf {} +
(cd "$tree" && tar cf - . | xz -T0 -6 > "$OLDPWD/.whl/lrsite.tar.xz.tmp") && mv .whl/lrsite.tar.xz.tmp .whl/lrsite.tar.xz
rm -rf "$tree"
ls -la .whl .whl/encode .whl/lerobot .whl/ldata
