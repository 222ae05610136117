"""A worker pool forked after a PyAV decode in the parent must not hang: PyAV >= 18 keeps one frame
reformatter per thread whose swscale slice threads live only in the parent (`datakit doctor
--workers 2` and convert's pool hung in CI after a decode earlier in the same process)."""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

av = pytest.importorskip("av")

import datakit.machine  # noqa: E402,F401  (registers datakit's at-fork hook)
from datakit.synth import encode_video  # noqa: E402
from helpers import pyav_decode_all  # noqa: E402

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="fork is POSIX-only")]

_UNDO = {"reformatter": None}  # the control's hook puts this back in the child while it is set


def _undo_in_child() -> None:
    if _UNDO["reformatter"] is not None:
        import av.video.frame as frame_mod
        frame_mod._thread_local.reformatter = _UNDO["reformatter"]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_undo_in_child)  # registered after datakit's: runs after it


def _decode_after_parent_decode(tmp_path):
    """A small h264 video decoded once here; the parent's reformatter (None if PyAV keeps none)."""
    rng = np.random.default_rng(0)
    path = encode_video(tmp_path / "v.mp4", [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
                                            for _ in range(4)], fps=10, codec="h264")
    pyav_decode_all(path)
    import av.video.frame as frame_mod
    inherited = getattr(getattr(frame_mod, "_thread_local", None), "reformatter", None)
    if inherited is None:
        pytest.skip("this PyAV keeps no per-thread reformatter: nothing to guard")
    return path, inherited


def _decode_in_child(path, seconds: float) -> str:
    """Fork; the child decodes `path` to RGB; 'ok', or 'hung' when it has not exited in `seconds`."""
    pid = os.fork()
    if pid == 0:  # the child exits at once: no pytest teardown in it
        try:
            pyav_decode_all(path)
        finally:
            os._exit(0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return "ok"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"


def test_child_decodes_after_a_decode_in_the_parent(tmp_path):
    path, _ = _decode_after_parent_decode(tmp_path)
    assert _decode_in_child(path, 30) == "ok"


def test_control_the_inherited_reformatter_hangs(tmp_path):
    """Positive control: put the parent's reformatter back in the child and the same decode hangs,
    so the test above guards a real hazard."""
    path, inherited = _decode_after_parent_decode(tmp_path)
    _UNDO["reformatter"] = inherited
    try:
        assert _decode_in_child(path, 2) == "hung"
    finally:
        _UNDO["reformatter"] = None
