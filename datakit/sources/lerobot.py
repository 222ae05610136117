"""LeRobot v2.0 / v2.1 / v3.0 datasets: scan the metadata, load one episode's table."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa

from datakit import source_paths
from datakit.errors import SourceError
from datakit.sources.checks import camera_name_problem
from datakit.sources.columns import image_bytes, scalar_column, vector_column
from datakit.sources.fields import float_field, format_path, int_field, read_json, read_jsonl, read_parquet
from datakit.sources.episode import CameraSpec, DatasetSpec, EpisodeRef, EpisodeTable, VideoSlice, task_text


def _flat_names(names, n: int, prefix: str) -> list[str]:
    """`names` of a vector feature: a list, {"motors": [...]} (older datasets) or None."""
    if isinstance(names, dict):
        names = [x for v in names.values() for x in (v if isinstance(v, list) else [v])]
    if isinstance(names, list) and len(names) == n and all(isinstance(x, str) for x in names):
        return list(names)
    return [f"{prefix}_{i}" for i in range(n)]


def _shape(name: str, ft: dict, info_path: Path) -> list[int]:
    """A feature's shape: a list of positive ints, else a SourceError naming the feature."""
    shape = ft.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0
                                              for d in shape):
        raise SourceError(info_path, f"feature {name!r}: shape {shape!r} is not a list of positive integers")
    return shape


def _camera_hw(name: str, ft: dict, info_path: Path) -> tuple[int, int]:
    shape, names = _shape(name, ft, info_path), ft.get("names")
    if len(shape) != 3:
        raise SourceError(info_path, f"feature {name!r}: image shape {shape} is not 3-d")
    if isinstance(names, list) and "height" in names and "width" in names and len(names) == 3:
        return int(shape[names.index("height")]), int(shape[names.index("width")])
    if shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4):
        return int(shape[1]), int(shape[2])  # channel first
    return int(shape[0]), int(shape[1])  # channel last


def _vector_dim(name: str, ft: dict, info_path: Path) -> int:
    return int(np.prod(_shape(name, ft, info_path))) if ft.get("shape") is not None else 1


def scan_lerobot(root: Path) -> DatasetSpec:
    root = Path(root)
    info_path = root / source_paths.LEROBOT_INFO
    if not info_path.is_file():
        raise SourceError(info_path, "missing meta/info.json")
    info = read_json(info_path)
    if not isinstance(info, dict):
        raise SourceError(info_path, f"not a json object (a {type(info).__name__})")
    version = info.get("codebase_version")
    if version not in source_paths.LEROBOT_VERSIONS:
        raise SourceError(info_path, f"unknown codebase_version {version!r} "
                                     f"(supported: {', '.join(source_paths.LEROBOT_VERSIONS)})")
    features = info.get("features") or {}
    if not isinstance(features, dict) or not all(isinstance(ft, dict) for ft in features.values()):
        raise SourceError(info_path, "features is not a json object of feature objects")
    fps = info.get("fps")
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps < float("inf"):
        raise SourceError(info_path, f"missing or invalid fps {fps!r} (must be a positive number)")
    fps = float(fps)
    for key in ("data_path", "video_path"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise SourceError(info_path, f"{key} {info[key]!r} is not a string")
    cameras = {name: CameraSpec(name, *_camera_hw(name, ft, info_path), storage=ft["dtype"])
               for name, ft in features.items() if ft.get("dtype") in ("video", "image")}
    for name in cameras:  # before any path is built from it
        if problem := camera_name_problem(name):
            raise SourceError(info_path, f"camera name {name!r} {problem}")
    for key in (source_paths.LEROBOT_STATE_KEY, source_paths.LEROBOT_ACTION_KEY):
        if key not in features:
            raise SourceError(info_path, f"no {key!r} feature")
    st, ac = features[source_paths.LEROBOT_STATE_KEY], features[source_paths.LEROBOT_ACTION_KEY]
    state_names = _flat_names(st.get("names"), _vector_dim(source_paths.LEROBOT_STATE_KEY, st, info_path), "state")
    action_names = _flat_names(ac.get("names"), _vector_dim(source_paths.LEROBOT_ACTION_KEY, ac, info_path), "action")
    video_cams = [c for c, spec in cameras.items() if spec.storage == "video"]
    if version == "v3.0":
        tasks, episodes = _scan_v3(root, info, video_cams)
    else:
        tasks, episodes = _scan_v2(root, info, video_cams)
    total = info.get("total_episodes")
    total = total if isinstance(total, int) and not isinstance(total, bool) else None
    return DatasetSpec(root=root, format="lerobot", version=version, fps=fps, cameras=cameras,
                       state_names=state_names, action_names=action_names, tasks=tasks, episodes=episodes,
                       total_episodes=total, described=_described(info, features))


def _described(info: dict, features: dict) -> dict:
    """LeRobot's own description of the dataset that the shards keep for LeRobot readers
    (`datakit.lerobot`): robot_type and info.json's features as they are."""
    robot = info.get("robot_type")
    return {"robot_type": robot if isinstance(robot, str) else None, "features": features}


def _template(info: dict, key: str, default: str) -> str:
    return info.get(key) or default


def _task_list(by_index: dict[int, str], path: Path) -> list[str]:
    """task_index -> text as a list; a negative index is a SourceError."""
    if any(i < 0 for i in by_index):
        raise SourceError(path, f"negative task_index {min(by_index)}")
    return [by_index.get(i, "") for i in range(max(by_index, default=-1) + 1)]


def _scan_v2(root: Path, info: dict, video_cams: list[str]) -> tuple[list[str], list[EpisodeRef]]:
    info_path = root / source_paths.LEROBOT_INFO
    tasks_path = root / source_paths.LEROBOT_V2_TASKS
    by_index: dict[int, str] = {}
    for i, r in enumerate(read_jsonl(tasks_path)):
        t = int_field(r, "task_index", tasks_path, f"line {i + 1}")
        if t in by_index:
            raise SourceError(tasks_path, f"task_index {t} is listed more than once")
        by_index[t] = str(r.get("task", ""))
    tasks = _task_list(by_index, tasks_path)
    chunks = info.get("chunks_size") or source_paths.LEROBOT_CHUNKS_SIZE
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks <= 0:
        raise SourceError(info_path, f"invalid chunks_size {chunks!r} (must be a positive integer)")
    data_tpl = _template(info, "data_path", source_paths.LEROBOT_V2_DATA_PATH)
    video_tpl = _template(info, "video_path", source_paths.LEROBOT_V2_VIDEO_PATH)
    ep_path = root / source_paths.LEROBOT_V2_EPISODES
    episodes = []
    for i, row in enumerate(read_jsonl(ep_path)):
        e = int_field(row, "episode_index", ep_path, f"line {i + 1}")
        length = int_field(row, "length", ep_path, f"line {i + 1} (episode {e})")
        chunk = e // chunks
        videos = {cam: VideoSlice(root / format_path(video_tpl, info_path, "video_path", episode_chunk=chunk,
                                                      video_key=cam, episode_index=e))
                  for cam in video_cams}
        source = root / format_path(data_tpl, info_path, "data_path", episode_chunk=chunk, episode_index=e)
        episodes.append(EpisodeRef(episode_index=e, length=length, source=source, videos=videos))
    episodes.sort(key=lambda r: r.episode_index)
    return tasks, episodes


def read_v3_tasks(path: Path) -> list[str]:
    """meta/tasks.parquet: task text in a `task` column, or as the pandas index (column
    `__index_level_0__`, or named by the pandas metadata), with a `task_index` column."""
    table = read_parquet(path)
    names = table.column_names
    col = "task" if "task" in names else source_paths.PANDAS_INDEX_COLUMN if source_paths.PANDAS_INDEX_COLUMN in names else None
    if col is None and table.schema.metadata and b"pandas" in table.schema.metadata:
        index_cols = json.loads(table.schema.metadata[b"pandas"]).get("index_columns", [])
        col = next((c for c in index_cols if isinstance(c, str) and c in names), None)
    if col is None:
        strings = [n for n in names if pa.types.is_string(table.schema.field(n).type)
                   or pa.types.is_large_string(table.schema.field(n).type)]
        col = strings[0] if len(strings) == 1 else None
    if col is None or "task_index" not in names:
        raise SourceError(path, f"no task text / task_index columns (columns: {names})")
    indices = table["task_index"].to_pylist()
    if not all(isinstance(i, int) for i in indices):
        raise SourceError(path, "task_index column holds nulls or non-integers")
    if len(set(indices)) != len(indices):
        raise SourceError(path, "a task_index is listed more than once")
    tasks: dict[int, str] = dict(zip(indices, ["" if t is None else str(t) for t in table[col].to_pylist()]))
    return _task_list(tasks, path)


def _scan_v3(root: Path, info: dict, video_cams: list[str]) -> tuple[list[str], list[EpisodeRef]]:
    tasks = read_v3_tasks(root / source_paths.LEROBOT_V3_TASKS)
    ep_dir = root / source_paths.LEROBOT_V3_EPISODES_DIR
    files = sorted(ep_dir.glob(source_paths.LEROBOT_V3_EPISODES_GLOB))
    if not files:
        raise SourceError(ep_dir, "no episode metadata parquet files")
    data_tpl = _template(info, "data_path", source_paths.LEROBOT_V3_DATA_PATH)
    video_tpl = _template(info, "video_path", source_paths.LEROBOT_V3_VIDEO_PATH)
    info_path = root / source_paths.LEROBOT_INFO
    episodes = []
    for f in files:
        table = read_parquet(f)
        cols = [c for c in table.column_names if not c.startswith("stats/")]
        needed = ["episode_index", "length", "data/chunk_index", "data/file_index"]
        needed += [f"videos/{cam}/{k}" for cam in video_cams
                   for k in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")]
        missing = [c for c in needed if c not in cols]
        if missing:
            raise SourceError(f, f"missing columns {missing}")
        for i, row in enumerate(table.select(cols).to_pylist()):
            e = int_field(row, "episode_index", f, f"row {i}")
            what = f"row {i} (episode {e})"
            videos = {}
            for cam in video_cams:
                p = root / format_path(video_tpl, info_path, "video_path", video_key=cam,
                                        chunk_index=int_field(row, f"videos/{cam}/chunk_index", f, what),
                                        file_index=int_field(row, f"videos/{cam}/file_index", f, what))
                videos[cam] = VideoSlice(p, float_field(row, f"videos/{cam}/from_timestamp", f, what),
                                         float_field(row, f"videos/{cam}/to_timestamp", f, what))
            source = root / format_path(data_tpl, info_path, "data_path",
                                         chunk_index=int_field(row, "data/chunk_index", f, what),
                                         file_index=int_field(row, "data/file_index", f, what))
            episodes.append(EpisodeRef(episode_index=e, length=int_field(row, "length", f, what),
                                       source=source, videos=videos))
    episodes.sort(key=lambda r: r.episode_index)
    return tasks, episodes


def load_lerobot_episode(spec: DatasetSpec, ref: EpisodeRef) -> EpisodeTable:
    path = Path(ref.source)
    for cam, vs in ref.videos.items():
        if vs is not None and not Path(vs.path).is_file():
            raise SourceError(vs.path, "missing video file")
    filters = [("episode_index", "=", ref.episode_index)] if spec.version == "v3.0" else None
    table = read_parquet(path, filters=filters)
    if len(table) != ref.length:
        raise SourceError(path, f"episode {ref.episode_index} has {len(table)} rows but the metadata "
                                f"says length {ref.length}")
    if "episode_index" in table.column_names:
        rows_ep = scalar_column(table, "episode_index", path, np.int64)
        if (rows_ep != ref.episode_index).any():
            t = int(np.argmax(rows_ep != ref.episode_index))
            raise SourceError(path, f"row {t} belongs to episode {int(rows_ep[t])}, not to episode "
                                    f"{ref.episode_index} as the episode metadata says")
    if "frame_index" in table.column_names:
        table = table.sort_by("frame_index")
        frame_index = scalar_column(table, "frame_index", path, np.int64)
    else:
        frame_index = np.arange(len(table), dtype=np.int64)
    if "timestamp" in table.column_names:
        timestamp = scalar_column(table, "timestamp", path, np.float64)
    else:
        timestamp = frame_index / spec.fps
    if "task_index" in table.column_names:
        task_index = scalar_column(table, "task_index", path, np.int64)
    else:
        task_index = np.zeros(len(table), dtype=np.int64)
    task = task_text(spec.tasks, int(task_index[0])) if len(task_index) else ""
    images = {cam: image_bytes(table, cam, path) for cam, c in spec.cameras.items() if c.storage == "image"}
    return EpisodeTable(episode_index=ref.episode_index, frame_index=frame_index, timestamp=timestamp,
                        state=vector_column(table, source_paths.LEROBOT_STATE_KEY, path),
                        action=vector_column(table, source_paths.LEROBOT_ACTION_KEY, path),
                        task_index=task_index, task=task, images=images)


__all__ = ["scan_lerobot", "load_lerobot_episode", "read_v3_tasks", "read_parquet"]
