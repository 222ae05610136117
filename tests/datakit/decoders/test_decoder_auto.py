"""`--decoder auto` on the conversion's hot path: when the order puts PyAV first, the file is opened
once (the decoder's container is the probe) and frame 0 is not decoded before the read; when a
ranking puts another backend first, that backend is checked on frame 0 as before."""
from __future__ import annotations

import json

import av
import numpy as np
import pytest

from datakit.decoders import open_decoder, pyav_backend
from datakit.synth.video import encode_video


@pytest.fixture()
def video(tmp_path):
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(6)]
    return encode_video(tmp_path / "v.mp4", frames, fps=10, codec="h264")


def _count_opens(monkeypatch) -> list[str]:
    opened: list[str] = []
    real = av.open

    def counting(*a, **k):
        opened.append(str(a[0]))
        return real(*a, **k)

    monkeypatch.setattr(av, "open", counting)
    return opened


def test_auto_with_pyav_first_opens_once_and_skips_the_frame0_check(video, tmp_path, monkeypatch):
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(tmp_path / "none.json"))
    opened = _count_opens(monkeypatch)
    decoded: list[list[int]] = []
    real_get = pyav_backend.PyAVDecoder.get_frames
    monkeypatch.setattr(pyav_backend.PyAVDecoder, "get_frames",
                        lambda self, idx: decoded.append(list(idx)) or real_get(self, idx))
    dec = open_decoder(video, "auto")
    try:
        assert dec.backend == "pyav" and dec.info.codec == "h264" and dec.info.num_frames == 6
        assert opened == [str(video)]  # no separate probe
        assert decoded == []  # no frame-0 decode before the conversion's own read
        frames = list(dec.iter_frames(0, 6))
    finally:
        dec.close()
    ref = open_decoder(video, "pyav")
    try:
        assert np.array_equal(np.stack(frames), ref.get_frames(range(6)))
    finally:
        ref.close()


def test_auto_with_another_backend_ranked_first_still_checks_frame0(video, tmp_path, monkeypatch):
    """Positive control: the shortcut is for PyAV only; a ranked backend that fails on frame 0
    falls back to the next one (here: a stand-in backend whose frames have the wrong shape)."""
    from datakit import decoders

    class Bad:
        backend = "torchcodec"
        closed = False

        def __init__(self, path):
            self.info = decoders.probe_video(path)

        def get_frames(self, idx):
            return np.zeros((1, 2, 2, 3), np.uint8)

        def close(self):
            Bad.closed = True

    real_module = decoders.backend_module
    monkeypatch.setattr(decoders, "backend_module", lambda name: type("M", (), {
        "open_video": staticmethod(lambda p, **k: Bad(p))}) if name == "torchcodec" else real_module(name))
    rank = tmp_path / "decoders.json"
    rank.write_text(json.dumps({"conversion": {"h264": ["torchcodec"]}}))
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(rank))
    dec = open_decoder(video, "auto")
    try:
        assert Bad.closed and dec.backend == "pyav"  # checked, refused on its frame 0, fell back
    finally:
        dec.close()


def test_pyav_decoder_names_a_damaged_or_missing_file(tmp_path):
    from datakit.errors import SourceError

    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video at all" * 10)
    for path, words in ((bad, "corrupt or truncated"), (tmp_path / "gone.mp4", "missing video file")):
        with pytest.raises(SourceError, match=words):
            open_decoder(path, "auto")
