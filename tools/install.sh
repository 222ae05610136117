#!/usr/bin/env bash
# Create .venv (if missing) and install the project with everything it needs on a fresh Debian
# machine: FFmpeg 5.1 libraries for torchcodec (apt-get, when missing) and the CPU build of torch,
# pinned so that no multi-GB CUDA build is pulled. Any failed step fails the install (set -e and
# pipefail); the Makefile writes its stamp only after this script succeeded.
# Progress: one line per step with the time so far, and a line every INSTALL_TICK_S seconds (30)
# while a step runs (pip is quiet for minutes: 3.5 of them on a fresh 2-core machine in issue 35).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TICK=${INSTALL_TICK_S:-30}
STEPS=5

step() {  # step N "what": one line, then run the rest of the arguments with a ticker beside them
  local n=$1 what=$2
  shift 2
  echo "install [$n/$STEPS] $what (${SECONDS}s so far)"
  ( while sleep "$TICK"; do echo "install [$n/$STEPS] ... still $what (${SECONDS}s)"; done ) &
  local ticker=$!
  local rc=0
  "$@" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  return "$rc"
}

if command -v dpkg >/dev/null && ! dpkg -s libavdevice59 >/dev/null 2>&1; then
  if command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    step 1 "updating apt's package lists" apt-get update -qq
    step 1 "installing FFmpeg 5.1 libraries (libavdevice59) with apt-get" apt-get install -y -qq libavdevice59
  else
    echo "warning: libavdevice59 missing and no apt-get: torchcodec will be reported unavailable" >&2
  fi
fi

# pip's "Location" warnings are noise; everything else is shown, and pip's own exit status counts.
pip_install() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location" >&2)
}

[ -x "$VENV/bin/python" ] || step 2 "creating $VENV" "$PYTHON" -m venv "$VENV"
step 2 "upgrading pip" pip_install --upgrade pip
# torch first and pinned: an unpinned torch resolves to a CUDA build of several GB.
step 3 "installing torch (the CPU build)" pip_install -c tools/constraints.txt torch
# ray (the [ray] extra: --engine ray and its tests) adds ~250 MB and ~45 s; ROBODATA_NO_RAY=1 leaves
# it out, and the Ray tests then skip.
extras="convert,dev,remote,encode"
[ "${ROBODATA_NO_RAY:-0}" = 1 ] || extras="$extras,ray"
step 4 "installing the project and its dependencies ($extras)" pip_install -c tools/constraints.txt -e ".[$extras]"
echo "install [5/$STEPS] checking the imports (${SECONDS}s so far)"
"$VENV/bin/python" -c "import torch, av, decord, pyarrow, h5py, webdataset, fsspec, s3fs, huggingface_hub, moto, safetensors, sentencepiece, diffusers, transformers; print('installed: torch', torch.__version__, '| av', av.__version__)"
echo "install: done in ${SECONDS}s"
