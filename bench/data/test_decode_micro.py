"""Micro-benchmarks of the hot decode calls, per backend (pytest-benchmark; not part of `make test`):

    .venv/bin/pytest bench/data/test_decode_micro.py --benchmark-only

In-process and warm, so they isolate the call itself: opening a file, one random frame, a
33-frame clip, and a full pass over a short video. `datakit bench-decoders` is the end-to-end
measurement (fresh process per measurement, CPU and memory, worker sweeps); these are for
watching a change to a backend module. A backend that is not installed is skipped.
"""
from __future__ import annotations

import random

import pytest

from datakit.commands.bench_decoders.videos import VideoSpec, generate
from datakit.decoders import BackendUnavailable, backend_module

# torchcodec before decord: decord2's FFmpeg loaded first makes torchcodec crash (see decord_backend)
BACKENDS = ["pyav", "torchcodec", "decord"]
FRAMES = 120


@pytest.fixture(scope="module", params=["h264", "av1"])
def video(request, tmp_path_factory):
    gop = 2 if request.param == "av1" else None
    return generate(VideoSpec(request.param, 180, 320, gop=gop, frames=FRAMES), tmp_path_factory.mktemp("v"))


def _open(name, path):
    try:
        return backend_module(name).open_video(path, threads=1)
    except BackendUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.parametrize("name", BACKENDS)
def test_open(benchmark, name, video):
    _open(name, video.path).close()
    benchmark(lambda: _open(name, video.path).close())


@pytest.mark.parametrize("name", BACKENDS)
def test_single_random_frame(benchmark, name, video):
    dec = _open(name, video.path)
    rng = random.Random(0)
    out = benchmark(lambda: dec.get_frames([rng.randrange(FRAMES)]))
    assert out.shape == (1, 180, 320, 3)
    dec.close()


@pytest.mark.parametrize("name", BACKENDS)
def test_clip_33(benchmark, name, video):
    dec = _open(name, video.path)
    rng = random.Random(0)

    def clip():
        s = rng.randrange(FRAMES - 33)
        return sum(len(a) for a in dec.read_range(s, s + 33))

    assert benchmark(clip) == 33
    dec.close()


@pytest.mark.parametrize("name", BACKENDS)
def test_sequential_pass(benchmark, name, video):
    dec = _open(name, video.path)
    assert benchmark(lambda: sum(len(a) for a in dec.read_range(0, FRAMES))) == FRAMES
    dec.close()
