"""Sources: find out what a folder holds, list its episodes, load one episode's table."""
from __future__ import annotations

from pathlib import Path

from datakit import layout
from datakit.errors import SourceError
from datakit.sources.episode import CameraSpec, DatasetSpec, EpisodeRef, EpisodeTable, VideoSlice

FORMATS = ("lerobot", "droid")


def detect_format(root: str | Path) -> str:
    """"lerobot" (has meta/info.json) or "droid" (has a metadata_*.json below root)."""
    root = Path(root)
    if not root.is_dir():
        raise SourceError(root, "no such folder")
    if (root / layout.LEROBOT_INFO).is_file():
        return "lerobot"
    if next(iter(root.rglob(layout.DROID_METADATA_GLOB)), None) is not None:
        return "droid"
    if (root / layout.LEROBOT_INFO).parent.is_dir():  # has meta/ but no info.json: a broken LeRobot
        raise SourceError(root / layout.LEROBOT_INFO, "missing meta/info.json")
    raise SourceError(root, f"not a LeRobot dataset (no {layout.LEROBOT_INFO}) nor a DROID folder "
                            f"(no {layout.DROID_METADATA_GLOB})")


def scan(root: str | Path, fmt: str = "auto", check: bool = True) -> DatasetSpec:
    """Read the metadata of the dataset at `root` (format "auto", "lerobot" or "droid").

    With check=True (convert) the first error of `checks.check_dataset` is raised as a
    SourceError; check=False returns the spec as read, for `datakit doctor` to report every
    finding. Metadata too malformed to build a spec from raises SourceError either way."""
    from datakit.sources.checks import check_dataset, raise_first_error

    root = Path(root)
    if fmt == "auto":
        fmt = detect_format(root)
    if fmt == "lerobot":
        from datakit.sources.lerobot import scan_lerobot

        spec = scan_lerobot(root)
    elif fmt == "droid":
        from datakit.sources.droid import scan_droid

        spec = scan_droid(root)
    else:
        raise ValueError(f"unknown source format {fmt!r} (auto, {', '.join(FORMATS)})")
    if check:
        raise_first_error(check_dataset(spec))
    return spec


def load_episode(spec: DatasetSpec, ref: EpisodeRef) -> EpisodeTable:
    """The numeric/text columns (and embedded images) of one episode. Raises SourceError for a
    missing video file or an unreadable/inconsistent table, so the caller can skip the episode."""
    if spec.format == "lerobot":
        from datakit.sources.lerobot import load_lerobot_episode

        return load_lerobot_episode(spec, ref)
    if spec.format == "droid":
        from datakit.sources.droid import load_droid_episode

        return load_droid_episode(spec, ref)
    raise ValueError(f"unknown source format {spec.format!r}")


__all__ = ["CameraSpec", "DatasetSpec", "EpisodeRef", "EpisodeTable", "VideoSlice", "FORMATS",
           "detect_format", "load_episode", "scan"]
