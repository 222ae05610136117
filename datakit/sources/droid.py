"""Raw DROID: one folder per episode holding metadata_*.json, trajectory.h5 and
recordings/MP4/<camera serial>.mp4."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from datakit import source_paths
from datakit.errors import SourceError
from datakit.sources.checks import member_name_problem
from datakit.sources.episode import CameraSpec, DatasetSpec, EpisodeRef, EpisodeTable, VideoSlice


def find_metadata(root: Path) -> list[Path]:
    """metadata_*.json files below root, in sorted order of their folders (relative to root)."""
    files = [p for p in Path(root).rglob(source_paths.DROID_METADATA_GLOB) if p.is_file()]
    return sorted(files, key=lambda p: (p.parent.relative_to(root).as_posix(), p.name))


def _metadata(path: Path) -> dict:
    try:
        meta = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise SourceError(path, f"unreadable metadata json: {e}") from None
    except RecursionError:  # valid JSON, but nested deeper than the parser recurses
        raise SourceError(path, "unreadable metadata json: nested too deeply to parse") from None
    if not isinstance(meta, dict):
        raise SourceError(path, "metadata is not a json object")
    return meta


def _episode_metadata(folder: Path) -> tuple[Path, dict]:
    files = sorted(Path(folder).glob(source_paths.DROID_METADATA_GLOB))
    if not files:
        raise SourceError(folder, f"no {source_paths.DROID_METADATA_GLOB}")
    return files[0], _metadata(files[0])


def _video_path(folder: Path, serial, meta_path: Path, key: str) -> Path | None:
    """recordings/MP4/<serial>.mp4 of the episode, None for a null serial; a serial that is not
    a plain file name (a path separator, '..', a control character) is a SourceError."""
    if serial is None or str(serial).strip() in ("", "None", "null"):
        return None
    serial = str(serial).strip()
    problem = member_name_problem(serial)
    if problem:
        raise SourceError(meta_path, f"{key} {serial!r} {problem}: it would name a file outside the episode")
    return folder / source_paths.DROID_MP4_DIR / source_paths.DROID_MP4_NAME.format(serial=serial)


def probe_video_size(path: Path) -> tuple[int, int]:
    """(height, width) of the first video stream of an mp4."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            return int(stream.codec_context.height), int(stream.codec_context.width)
    except (OSError, IndexError, av.FFmpegError) as e:
        raise SourceError(path, f"unreadable video: {e}") from None


def scan_droid(root: Path) -> DatasetSpec:
    root = Path(root)
    files = find_metadata(root)
    if not files:
        raise SourceError(root, f"no DROID episodes ({source_paths.DROID_METADATA_GLOB}) below this folder")
    tasks: list[str] = []
    episodes: list[EpisodeRef] = []
    sizes: dict[str, tuple[int, int]] = {}
    seen = set()
    uuids: dict[str, Path] = {}
    for path in files:
        folder = path.parent
        if folder in seen:  # one episode per folder, even with several metadata files
            continue
        seen.add(folder)
        meta = _metadata(path)
        uuid = meta.get("uuid")
        if isinstance(uuid, str) and uuid:
            if uuid in uuids:  # the same recording twice (a copied folder): a duplicated episode
                raise SourceError(path, f"uuid {uuid!r} is also the uuid of {uuids[uuid]}: the same episode twice")
            uuids[uuid] = path
        task = str(meta.get("current_task") or "")
        if task not in tasks:
            tasks.append(task)
        try:
            length = int(meta["trajectory_length"])
        except (KeyError, TypeError, ValueError):
            raise SourceError(path, "missing or invalid trajectory_length") from None
        videos: dict[str, VideoSlice | None] = {}
        for cam, key in source_paths.DROID_CAMERAS.items():
            mp4 = _video_path(folder, meta.get(key), path, key)
            videos[cam] = None if mp4 is None else VideoSlice(mp4)
            # native size: probed from the first episode that has this camera's file
            if mp4 is not None and cam not in sizes and mp4.is_file():
                sizes[cam] = probe_video_size(mp4)
        episodes.append(EpisodeRef(episode_index=len(episodes), length=length, source=folder, videos=videos))
    cameras = {cam: CameraSpec(cam, *sizes[cam], storage="video") for cam in source_paths.DROID_CAMERAS if cam in sizes}
    if not cameras:
        raise SourceError(root, "no DROID camera video found in any episode")
    for ref in episodes:  # a camera without any video anywhere is not part of the dataset
        for cam in [c for c in ref.videos if c not in cameras]:
            del ref.videos[cam]
    n = source_paths.DROID_NUM_JOINTS
    state_names = [f"joint_position_{i}" for i in range(n)] + ["gripper_position"]
    action_names = [f"action_joint_position_{i}" for i in range(n)] + ["action_gripper_position"]
    return DatasetSpec(root=root, format="droid", version="droid-raw", fps=source_paths.DROID_FPS,
                       cameras=cameras, state_names=state_names, action_names=action_names,
                       tasks=tasks, episodes=episodes)


def _read(h5, key: str, path: Path) -> np.ndarray:
    if key not in h5:
        raise SourceError(path, f"no {key!r} dataset")
    arr = np.asarray(h5[key][()], dtype=np.float64)
    return arr.reshape(len(arr), -1)


def load_droid_episode(spec: DatasetSpec, ref: EpisodeRef) -> EpisodeTable:
    import h5py

    folder = Path(ref.source)
    for vs in ref.videos.values():
        if vs is not None and not Path(vs.path).is_file():
            raise SourceError(vs.path, "missing video file")
    _, meta = _episode_metadata(folder)
    path = folder / source_paths.DROID_TRAJECTORY
    if not path.is_file():
        raise SourceError(path, f"missing {source_paths.DROID_TRAJECTORY}")
    try:
        with h5py.File(path, "r") as h5:
            state = np.concatenate([_read(h5, source_paths.DROID_STATE_JOINTS, path),
                                    _read(h5, source_paths.DROID_STATE_GRIPPER, path)], axis=1)
            action = np.concatenate([_read(h5, source_paths.DROID_ACTION_JOINTS, path),
                                     _read(h5, source_paths.DROID_ACTION_GRIPPER, path)], axis=1)
    except SourceError:
        raise
    except (OSError, ValueError, KeyError) as e:
        raise SourceError(path, f"unreadable h5: {e}") from None
    if len(state) != len(action) or len(state) != ref.length:
        raise SourceError(path, f"trajectory has {len(state)} states and {len(action)} actions but the "
                                f"metadata says trajectory_length {ref.length}")
    task = str(meta.get("current_task") or "")
    task_i = spec.tasks.index(task) if task in spec.tasks else 0
    frame_index = np.arange(ref.length, dtype=np.int64)
    return EpisodeTable(episode_index=ref.episode_index, frame_index=frame_index,
                        timestamp=frame_index / float(spec.fps), state=state, action=action,
                        task_index=np.full(ref.length, task_i, dtype=np.int64), task=task)
