#!/usr/bin/env bash
# Create .venv (if missing) and install the project with everything it needs on a fresh Debian
# machine: FFmpeg 5.1 libraries for torchcodec (apt-get, when missing) and the CPU build of torch,
# pinned so that no multi-GB CUDA build is pulled. Any failed step fails the install (set -e and
# pipefail); the Makefile writes its stamp only after this script succeeded.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if command -v dpkg >/dev/null && ! dpkg -s libavdevice59 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null; then
    echo "installing FFmpeg 5.1 libraries (libavdevice59) for torchcodec"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libavdevice59 >/dev/null
  else
    echo "warning: libavdevice59 missing and no apt-get: torchcodec will be reported unavailable" >&2
  fi
fi

# pip's "Location" warnings are noise; everything else is shown, and pip's own exit status counts.
pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
pip_install --upgrade pip
# torch first and pinned: an unpinned torch resolves to a CUDA build of several GB.
pip_install -c tools/constraints.txt torch
# ray (the [ray] extra: --engine ray and its tests) adds ~250 MB and ~45 s; ROBODATA_NO_RAY=1 leaves
# it out, and the Ray tests then skip.
extras="convert,dev,remote,encode"
[ "${ROBODATA_NO_RAY:-0}" = 1 ] || extras="$extras,ray"
pip_install -c tools/constraints.txt -e ".[$extras]"
"$VENV/bin/python" -c "import torch, av, decord, pyarrow, h5py, webdataset, fsspec, s3fs, huggingface_hub, moto, safetensors, sentencepiece, diffusers, transformers; print('installed: torch', torch.__version__, '| av', av.__version__)"
