"""What the LeRobot peer scripts (peer_lerobot_pi05.py, peer_lerobot_gr00t.py) share: LeRobot
imported where OpenCV is missing, and the settings loop that records each setting and rewrites the
JSON report atomically after each one (a call cut short keeps what finished)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any, Callable

from bench.record import header


def stub_opencv() -> bool:
    """An empty `cv2` in sys.modules where OpenCV is missing (True when this put one there):
    `lerobot.policies` imports every policy and only GR00T's processor imports OpenCV (60 MB), which
    the benches never run. It has a spec, so a later `find_spec("cv2")` answers instead of raising."""
    if "cv2" in sys.modules or importlib.util.find_spec("cv2") is not None:
        return False
    stub = types.ModuleType("cv2")
    stub.__spec__ = importlib.machinery.ModuleSpec("cv2", None)
    sys.modules["cv2"] = stub
    return True


def import_lerobot() -> Any:
    """`lerobot`, with an empty `cv2` standing in where OpenCV is missing (`stub_opencv`)."""
    stub_opencv()
    import lerobot

    return lerobot


def run_settings(out: Path, settings: list[str], run_one: Callable[[str], dict[str, Any]], gpu: str) -> int:
    """Run `run_one(name)` for each setting; print each record (without its per-step lists) and
    rewrite `out` (bench/record.py's header, then {"peer", "version", "torch", "gpu", "settings": [...]}) after each."""
    import torch

    lerobot = import_lerobot()
    res: dict[str, Any] = {**header(), "peer": "lerobot", "version": getattr(lerobot, "__version__", None),
                           "torch": torch.__version__, "gpu": gpu, "settings": []}
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in settings:
        rec = run_one(name)
        res["settings"].append(rec)
        print(json.dumps({k: v for k, v in rec.items() if k not in ("losses", "step_times_s")}), flush=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1) + "\n")
        tmp.replace(out)
    return 0
