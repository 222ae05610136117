"""LeRobot v2.0 / v2.1 / v3.0 datasets: scan the metadata, load one episode's table."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datakit import layout
from datakit.errors import SourceError
from datakit.sources.episode import CameraSpec, DatasetSpec, EpisodeRef, EpisodeTable, VideoSlice


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SourceError(path, f"unreadable json: {e}") from None


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise SourceError(path, f"missing {path.parent.name}/{path.name}")
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        raise SourceError(path, f"unreadable jsonl: {e}") from None


def read_parquet(path: Path, columns=None, filters=None) -> pa.Table:
    if not path.is_file():
        raise SourceError(path, "missing parquet file")
    try:
        return pq.read_table(path, columns=columns, filters=filters)
    except (OSError, ValueError, pa.ArrowException) as e:
        raise SourceError(path, f"unreadable parquet: {e}") from None


def _flat_names(names, n: int, prefix: str) -> list[str]:
    """`names` of a vector feature: a list, {"motors": [...]} (older datasets) or None."""
    if isinstance(names, dict):
        names = [x for v in names.values() for x in (v if isinstance(v, list) else [v])]
    if isinstance(names, list) and len(names) == n and all(isinstance(x, str) for x in names):
        return list(names)
    return [f"{prefix}_{i}" for i in range(n)]


def _camera_hw(name: str, ft: dict, info_path: Path) -> tuple[int, int]:
    shape, names = list(ft.get("shape") or []), ft.get("names")
    if len(shape) != 3:
        raise SourceError(info_path, f"feature {name!r}: image shape {shape} is not 3-d")
    if isinstance(names, list) and "height" in names and "width" in names and len(names) == 3:
        return int(shape[names.index("height")]), int(shape[names.index("width")])
    if shape[0] in (1, 3, 4) and shape[2] not in (1, 3, 4):
        return int(shape[1]), int(shape[2])  # channel first
    return int(shape[0]), int(shape[1])  # channel last


def _vector_dim(ft: dict) -> int:
    shape = ft.get("shape") or [1]
    return int(np.prod(shape))


def scan_lerobot(root: Path) -> DatasetSpec:
    root = Path(root)
    info_path = root / layout.LEROBOT_INFO
    if not info_path.is_file():
        raise SourceError(info_path, "missing meta/info.json")
    info = _read_json(info_path)
    version = info.get("codebase_version")
    if version not in layout.LEROBOT_VERSIONS:
        raise SourceError(info_path, f"unknown codebase_version {version!r} "
                                     f"(supported: {', '.join(layout.LEROBOT_VERSIONS)})")
    features = info.get("features") or {}
    try:
        fps = float(info["fps"])
    except (KeyError, TypeError, ValueError):
        raise SourceError(info_path, "missing or invalid fps") from None
    cameras = {name: CameraSpec(name, *_camera_hw(name, ft, info_path), storage=ft["dtype"])
               for name, ft in features.items() if ft.get("dtype") in ("video", "image")}
    for key in (layout.LEROBOT_STATE_KEY, layout.LEROBOT_ACTION_KEY):
        if key not in features:
            raise SourceError(info_path, f"no {key!r} feature")
    st, ac = features[layout.LEROBOT_STATE_KEY], features[layout.LEROBOT_ACTION_KEY]
    state_names = _flat_names(st.get("names"), _vector_dim(st), "state")
    action_names = _flat_names(ac.get("names"), _vector_dim(ac), "action")
    video_cams = [c for c, spec in cameras.items() if spec.storage == "video"]
    if version == "v3.0":
        tasks, episodes = _scan_v3(root, info, video_cams)
    else:
        tasks, episodes = _scan_v2(root, info, video_cams)
    return DatasetSpec(root=root, format="lerobot", version=version, fps=fps, cameras=cameras,
                       state_names=state_names, action_names=action_names, tasks=tasks, episodes=episodes)


def _template(info: dict, key: str, default: str) -> str:
    return info.get(key) or default


def _scan_v2(root: Path, info: dict, video_cams: list[str]) -> tuple[list[str], list[EpisodeRef]]:
    rows = _read_jsonl(root / layout.LEROBOT_V2_TASKS)
    by_index = {int(r["task_index"]): str(r["task"]) for r in rows}
    tasks = [by_index.get(i, "") for i in range(max(by_index, default=-1) + 1)]
    chunks = int(info.get("chunks_size") or layout.LEROBOT_CHUNKS_SIZE)
    data_tpl = _template(info, "data_path", layout.LEROBOT_V2_DATA_PATH)
    video_tpl = _template(info, "video_path", layout.LEROBOT_V2_VIDEO_PATH)
    episodes = []
    for row in sorted(_read_jsonl(root / layout.LEROBOT_V2_EPISODES), key=lambda r: r["episode_index"]):
        e = int(row["episode_index"])
        chunk = e // chunks
        videos = {cam: VideoSlice(root / video_tpl.format(episode_chunk=chunk, video_key=cam, episode_index=e))
                  for cam in video_cams}
        episodes.append(EpisodeRef(episode_index=e, length=int(row["length"]),
                                   source=root / data_tpl.format(episode_chunk=chunk, episode_index=e),
                                   videos=videos))
    return tasks, episodes


def read_v3_tasks(path: Path) -> list[str]:
    """meta/tasks.parquet: task text in a `task` column, or as the pandas index (column
    `__index_level_0__`, or named by the pandas metadata), with a `task_index` column."""
    table = read_parquet(path)
    names = table.column_names
    col = "task" if "task" in names else layout.PANDAS_INDEX_COLUMN if layout.PANDAS_INDEX_COLUMN in names else None
    if col is None and table.schema.metadata and b"pandas" in table.schema.metadata:
        index_cols = json.loads(table.schema.metadata[b"pandas"]).get("index_columns", [])
        col = next((c for c in index_cols if isinstance(c, str) and c in names), None)
    if col is None:
        strings = [n for n in names if pa.types.is_string(table.schema.field(n).type)
                   or pa.types.is_large_string(table.schema.field(n).type)]
        col = strings[0] if len(strings) == 1 else None
    if col is None or "task_index" not in names:
        raise SourceError(path, f"no task text / task_index columns (columns: {names})")
    tasks: dict[int, str] = dict(zip(table["task_index"].to_pylist(), table[col].to_pylist()))
    return [tasks.get(i, "") for i in range(max(tasks, default=-1) + 1)]


def _scan_v3(root: Path, info: dict, video_cams: list[str]) -> tuple[list[str], list[EpisodeRef]]:
    tasks = read_v3_tasks(root / layout.LEROBOT_V3_TASKS)
    ep_dir = root / layout.LEROBOT_V3_EPISODES_DIR
    files = sorted(ep_dir.glob(layout.LEROBOT_V3_EPISODES_GLOB))
    if not files:
        raise SourceError(ep_dir, "no episode metadata parquet files")
    data_tpl = _template(info, "data_path", layout.LEROBOT_V3_DATA_PATH)
    video_tpl = _template(info, "video_path", layout.LEROBOT_V3_VIDEO_PATH)
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
        for row in table.select(cols).to_pylist():
            videos = {}
            for cam in video_cams:
                p = root / video_tpl.format(video_key=cam, chunk_index=row[f"videos/{cam}/chunk_index"],
                                            file_index=row[f"videos/{cam}/file_index"])
                videos[cam] = VideoSlice(p, float(row[f"videos/{cam}/from_timestamp"]),
                                         float(row[f"videos/{cam}/to_timestamp"]))
            source = root / data_tpl.format(chunk_index=row["data/chunk_index"], file_index=row["data/file_index"])
            episodes.append(EpisodeRef(episode_index=int(row["episode_index"]), length=int(row["length"]),
                                       source=source, videos=videos))
    episodes.sort(key=lambda r: r.episode_index)
    return tasks, episodes


def _matrix(table: pa.Table, key: str, path: Path) -> np.ndarray:
    if key not in table.column_names:
        raise SourceError(path, f"no {key!r} column")
    col = table[key].combine_chunks()
    n = len(col)
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) or pa.types.is_fixed_size_list(col.type):
        values = col.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
        if n and values.size % n:
            raise SourceError(path, f"column {key!r} has rows of different lengths")
        return values.reshape(n, values.size // n if n else 0)
    return col.to_numpy(zero_copy_only=False).astype(np.float32).reshape(n, 1)


def _image_bytes(table: pa.Table, cam: str, path: Path) -> list[bytes]:
    if cam not in table.column_names:
        raise SourceError(path, f"no {cam!r} image column")
    col = table[cam].combine_chunks()
    if pa.types.is_struct(col.type):
        col = col.field("bytes")
    out = col.to_pylist()
    if any(b is None for b in out):
        raise SourceError(path, f"image column {cam!r} has frames without embedded bytes")
    return out


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
    if "frame_index" in table.column_names:
        table = table.sort_by("frame_index")
        frame_index = table["frame_index"].to_numpy().astype(np.int64)
    else:
        frame_index = np.arange(len(table), dtype=np.int64)
    if "timestamp" in table.column_names:
        timestamp = table["timestamp"].to_numpy().astype(np.float64)
    else:
        timestamp = frame_index / spec.fps
    if "task_index" in table.column_names:
        task_index = table["task_index"].to_numpy().astype(np.int64)
    else:
        task_index = np.zeros(len(table), dtype=np.int64)
    first = int(task_index[0]) if len(task_index) else 0
    task = spec.tasks[first] if 0 <= first < len(spec.tasks) else ""
    images = {cam: _image_bytes(table, cam, path) for cam, c in spec.cameras.items() if c.storage == "image"}
    return EpisodeTable(episode_index=ref.episode_index, frame_index=frame_index, timestamp=timestamp,
                        state=_matrix(table, layout.LEROBOT_STATE_KEY, path),
                        action=_matrix(table, layout.LEROBOT_ACTION_KEY, path),
                        task_index=task_index, task=task, images=images)


__all__ = ["scan_lerobot", "load_lerobot_episode", "read_v3_tasks", "read_parquet"]
