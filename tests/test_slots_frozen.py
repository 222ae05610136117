"""SlotDetector: blank vs real as before, plus `frozen` for a real camera stuck on one picture."""
from __future__ import annotations

import numpy as np

from datakit.stages.slots import SlotDetector
from datakit.synth import blank_frame, synth_frame


def _feed(frames, chunk=3):
    d = SlotDetector()
    for i in range(0, len(frames), chunk):
        d.update(np.stack(frames[i:i + chunk]))
    return d


def test_moving_camera_is_real_not_frozen():
    d = _feed([synth_frame(i, 64, 96) for i in range(7)])
    assert d.slot == "real" and not d.frozen


def test_stuck_camera_is_frozen():
    rng = np.random.default_rng(0)
    still = synth_frame(3, 64, 96)
    noisy = [np.clip(still.astype(int) + rng.integers(-3, 4, still.shape), 0, 255).astype(np.uint8) for _ in range(7)]
    d = _feed(noisy)
    assert d.slot == "real" and d.frozen


def test_blank_camera_is_blank_not_frozen():
    d = _feed([blank_frame(64, 96) for _ in range(5)])
    assert d.slot == "blank" and not d.frozen


def test_single_frame_is_not_frozen():
    assert not _feed([synth_frame(0, 64, 96)]).frozen
