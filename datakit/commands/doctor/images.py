"""Audit a camera stored as images inside the table (LeRobot `dtype: image`): decode every
embedded image (Pillow), and run the same blank/frozen checks as for video.

- `image_unreadable` (error): an embedded image that Pillow cannot decode, at its frame
- `image_size` (error): an image whose size differs from the camera's declared size
"""
from __future__ import annotations

import io

import numpy as np

from datakit.commands.doctor.frames import CameraTracker, FrameAuditOptions
from datakit.sources.episode import DatasetSpec, EpisodeRef

MAX_IMAGE_FINDINGS = 5  # per camera and episode; the rest are counted in one more finding


def audit_images(spec: DatasetSpec, ref: EpisodeRef, cam: str, images: list[bytes],
                 opts: FrameAuditOptions) -> tuple[list, int]:
    """Findings for one image-stored camera of one episode, and the number of images decoded."""
    from PIL import Image

    tracker = CameraTracker(cam, str(ref.source), ref, opts)
    declared = spec.cameras.get(cam)
    bad: list[tuple[int, str, str]] = []
    for i, data in enumerate(images):
        try:
            rgb = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        except Exception as e:  # Pillow raises many types for damaged images
            bad.append((i, "image_unreadable", f"frame {i}: embedded image does not decode ({type(e).__name__}: {e})"))
            continue
        if declared is not None and rgb.shape[:2] != (declared.height, declared.width):
            bad.append((i, "image_size", f"frame {i}: image is {rgb.shape[0]}x{rgb.shape[1]}, declared "
                                         f"{declared.height}x{declared.width}"))
            continue
        tracker.frame(i, rgb, lambda rgb=rgb: rgb)
    for i, kind, msg in bad[:MAX_IMAGE_FINDINGS]:
        tracker.add(kind, i, msg)
    if len(bad) > MAX_IMAGE_FINDINGS:
        tracker.add(bad[MAX_IMAGE_FINDINGS][1], bad[MAX_IMAGE_FINDINGS][0],
                    f"{len(bad) - MAX_IMAGE_FINDINGS} more bad images from frame {bad[MAX_IMAGE_FINDINGS][0]}")
    tracker.finish()
    return tracker.findings, tracker.count


__all__ = ["audit_images"]
