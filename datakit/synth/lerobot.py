"""Faithful synthetic LeRobot datasets (v2.0, v2.1, v3.0) with real mp4 videos.

Every camera frame carries the dataset-wide frame index (the `index` column) as a barcode
(`read_frame_number`); blank cameras are all black. State/action are `synth_state` /
`synth_action`, so tests can use them as an oracle."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datakit import source_paths
from datakit.synth.video import blank_frame, encode_video, synth_frame


def synth_state(episode: int, length: int, dim: int, seed: int = 0) -> np.ndarray:
    """(length, dim) float32 smooth signal, different per episode/seed (the generators' oracle)."""
    t = np.arange(length, dtype=np.float64)[:, None]
    j = np.arange(dim, dtype=np.float64)[None, :]
    return (np.sin(0.05 * (j + 1) * t + 0.7 * episode + 0.3 * seed + j)
            + 0.1 * episode).astype(np.float32)


def synth_action(episode: int, length: int, dim: int, seed: int = 0) -> np.ndarray:
    """(length, dim) float32: the next state plus a small per-joint offset."""
    return (synth_state(episode, length + 1, dim, seed)[1:] + 0.01 * np.arange(dim)).astype(np.float32)


def camera_seed(seed: int, camera_index: int, episode: int) -> int:
    return seed * 10007 + camera_index * 101 + episode


def _frames(cam_i: int, blank: bool, ep: int, start: int, length: int, h: int, w: int, seed: int,
            detail: float = 0.0):
    for i in range(length):
        yield blank_frame(h, w) if blank else synth_frame(start + i, h, w, camera_seed(seed, cam_i, ep), detail=detail)


def _png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def _stats(arr: np.ndarray) -> dict:
    arr = arr.reshape(len(arr), -1).astype(np.float64)
    return {"min": arr.min(0).tolist(), "max": arr.max(0).tolist(), "mean": arr.mean(0).tolist(),
            "std": arr.std(0).tolist(), "count": [len(arr)]}


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=4))


def _write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _hf_metadata(state_dim: int, action_dim: int, image_cameras) -> dict:
    """Schema metadata that HF `datasets` writes, as LeRobot parquet files carry it."""
    def seq(n):
        return {"feature": {"dtype": "float32", "_type": "Value"}, "length": n, "_type": "Sequence"}

    feats = {source_paths.LEROBOT_STATE_KEY: seq(state_dim), source_paths.LEROBOT_ACTION_KEY: seq(action_dim)}
    feats.update({c: {"_type": "Image"} for c in image_cameras})
    feats["timestamp"] = {"dtype": "float32", "_type": "Value"}
    for k in ("frame_index", "episode_index", "index", "task_index"):
        feats[k] = {"dtype": "int64", "_type": "Value"}
    return {"info": {"features": feats}}


def _episode_table(ep, length, start, task_index, fps, state_dim, action_dim, image_cams, sizes, seed,
                   cam_order) -> pa.Table:
    state, action = synth_state(ep, length, state_dim, seed), synth_action(ep, length, action_dim, seed)
    frame_index = np.arange(length, dtype=np.int64)
    cols = {
        source_paths.LEROBOT_STATE_KEY: pa.array(list(state), type=pa.list_(pa.float32())),
        source_paths.LEROBOT_ACTION_KEY: pa.array(list(action), type=pa.list_(pa.float32())),
    }
    img_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for cam in image_cams:
        ci = cam_order.index(cam)
        h, w = sizes[cam]
        cols[cam] = pa.array([{"bytes": _png(synth_frame(start + i, h, w, camera_seed(seed, ci, ep))),
                               "path": f"frame_{i:06d}.png"} for i in range(length)], type=img_type)
    cols["timestamp"] = pa.array((frame_index / fps).astype(np.float32))
    cols["frame_index"] = pa.array(frame_index)
    cols["episode_index"] = pa.array(np.full(length, ep, dtype=np.int64))
    cols["index"] = pa.array(start + frame_index)
    cols["task_index"] = pa.array(np.full(length, task_index, dtype=np.int64))
    return pa.table(cols)


def _with_meta(table: pa.Table, meta: dict) -> pa.Table:
    return table.replace_schema_metadata({b"huggingface": json.dumps(meta).encode()})


def make_lerobot_dataset(root, *, version="v2.1", episode_lengths=(24, 31, 17),
                         cameras=("observation.images.top", "observation.images.wrist",
                                  "observation.images.side"),
                         blank_cameras=("observation.images.side",), image_cameras=(), height=96,
                         width=128, fps=10, codec="av1", channel_first=True, state_dim=6, action_dim=6,
                         tasks=("pick up the cube", "open the drawer"), seed=0,
                         v3_episodes_per_file: int | None = None, v3_task_column=None,
                         detail: float = 0.0, camera_sizes: dict[str, tuple[int, int]] | None = None) -> Path:
    """Write a LeRobot dataset of `version` under `root` (replaced if present) and return root.

    `cameras` are mp4 video features except those also in `image_cameras` (PNG in the parquet);
    episode e has task tasks[e % len(tasks)]. v3.0: `v3_episodes_per_file` episodes per data/video
    file (None: all in one); tasks.parquet stores the text as the pandas index column
    `__index_level_0__` (as `pd.DataFrame({"task_index": ...}, index=tasks).to_parquet` does), or
    as a column named `v3_task_column` (e.g. "task") if given. `detail` > 0 adds a panning
    multi-scale texture so that the video has a realistic bitrate (benchmarks). `camera_sizes`:
    (height, width) of the cameras it names (a wrist camera smaller than the scene camera); the
    others are `height` x `width`."""
    if version not in source_paths.LEROBOT_VERSIONS:
        raise ValueError(f"unknown version {version!r}")
    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    cam_order = list(cameras) + [c for c in image_cameras if c not in cameras]
    video_cams = [c for c in cam_order if c not in image_cameras]
    n_eps, total = len(episode_lengths), int(sum(episode_lengths))
    starts = np.concatenate([[0], np.cumsum(episode_lengths)[:-1]]).astype(int).tolist()
    ep_task = [e % len(tasks) for e in range(n_eps)]
    hf_meta = _hf_metadata(state_dim, action_dim, [c for c in cam_order if c in image_cameras])

    unknown = sorted(set(camera_sizes or {}) - set(cam_order))
    if unknown:
        raise ValueError(f"camera_sizes names cameras {unknown} that are not in cameras/image_cameras")
    sizes = {c: tuple((camera_sizes or {}).get(c, (height, width))) for c in cam_order}
    cam_names = ["channel", "height", "width"] if channel_first else ["height", "width", "channel"]
    features = {
        source_paths.LEROBOT_ACTION_KEY: {"dtype": "float32", "shape": [action_dim],
                                    "names": [f"motor_{i}" for i in range(action_dim)]},
        source_paths.LEROBOT_STATE_KEY: {"dtype": "float32", "shape": [state_dim],
                                   "names": [f"motor_{i}" for i in range(state_dim)]},
    }
    for cam in cam_order:
        h, w = sizes[cam]
        ft = {"dtype": "image" if cam in image_cameras else "video", "shape": [3, h, w] if channel_first else [h, w, 3],
              "names": cam_names}
        if cam in video_cams:
            ft["info"] = {"video.fps": float(fps), "video.height": h, "video.width": w,
                          "video.channels": 3, "video.codec": codec, "video.pix_fmt": "yuv420p",
                          "video.is_depth_map": False, "has_audio": False}
        features[cam] = ft
    for k in ("timestamp", "frame_index", "episode_index", "index", "task_index"):
        features[k] = {"dtype": "float32" if k == "timestamp" else "int64", "shape": [1], "names": None}
    info = {"codebase_version": version, "robot_type": "synthetic", "total_episodes": n_eps,
            "total_frames": total, "total_tasks": len(tasks)}

    tables = [_episode_table(e, n, starts[e], ep_task[e], fps, state_dim, action_dim, image_cameras,
                             sizes, seed, cam_order) for e, n in enumerate(episode_lengths)]
    global_stats = {k: _stats(np.stack(pa.concat_tables(tables)[k].to_numpy(zero_copy_only=False)))
                    for k in (source_paths.LEROBOT_STATE_KEY, source_paths.LEROBOT_ACTION_KEY)}

    if version in ("v2.0", "v2.1"):
        chunks = source_paths.LEROBOT_CHUNKS_SIZE
        info.update({"total_videos": n_eps * len(video_cams), "total_chunks": (n_eps - 1) // chunks + 1,
                     "chunks_size": chunks, "fps": fps, "splits": {"train": f"0:{n_eps}"},
                     "data_path": source_paths.LEROBOT_V2_DATA_PATH,
                     "video_path": source_paths.LEROBOT_V2_VIDEO_PATH if video_cams else None,
                     "features": features})
        for e, n in enumerate(episode_lengths):
            path = root / source_paths.LEROBOT_V2_DATA_PATH.format(episode_chunk=e // chunks, episode_index=e)
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(_with_meta(tables[e], hf_meta), path)
            for ci, cam in enumerate(cam_order):
                if cam in video_cams:
                    vpath = root / source_paths.LEROBOT_V2_VIDEO_PATH.format(
                        episode_chunk=e // chunks, video_key=cam, episode_index=e)
                    encode_video(vpath, _frames(ci, cam in blank_cameras, e, starts[e], n, *sizes[cam],
                                                seed, detail), fps, codec)
        _write_jsonl(root / source_paths.LEROBOT_V2_EPISODES,
                     [{"episode_index": e, "tasks": [tasks[ep_task[e]]], "length": n}
                      for e, n in enumerate(episode_lengths)])
        _write_jsonl(root / source_paths.LEROBOT_V2_TASKS, [{"task_index": i, "task": t} for i, t in enumerate(tasks)])
        if version == "v2.0":
            _write_json(root / source_paths.LEROBOT_STATS, global_stats)
        else:
            _write_jsonl(root / source_paths.LEROBOT_V21_EPISODES_STATS, [
                {"episode_index": e, "stats": {k: _stats(np.stack(t[k].to_numpy(zero_copy_only=False)))
                                               for k in (source_paths.LEROBOT_STATE_KEY, source_paths.LEROBOT_ACTION_KEY)}}
                for e, t in enumerate(tables)])
    else:
        _write_v3(root, info, features, tables, episode_lengths, starts, ep_task, tasks, cam_order,
                  video_cams, blank_cameras, hf_meta, sizes, fps, codec, seed,
                  v3_episodes_per_file or n_eps, v3_task_column, detail)
        _write_json(root / source_paths.LEROBOT_STATS, global_stats)
    _write_json(root / source_paths.LEROBOT_INFO, info)
    return root


def _write_v3(root, info, features, tables, lengths, starts, ep_task, tasks, cam_order, video_cams,
              blank_cameras, hf_meta, sizes, fps, codec, seed, per_file, task_column, detail=0.0):
    chunks = source_paths.LEROBOT_CHUNKS_SIZE
    n_eps = len(lengths)
    for ft in features.values():
        if ft["dtype"] != "video":
            ft["fps"] = fps
    info.update({"chunks_size": chunks, "data_files_size_in_mb": 100, "video_files_size_in_mb": 500,
                 "fps": fps, "splits": {"train": f"0:{n_eps}"}, "data_path": source_paths.LEROBOT_V3_DATA_PATH,
                 "video_path": source_paths.LEROBOT_V3_VIDEO_PATH if video_cams else None, "features": features})
    rows = []
    for first in range(0, n_eps, per_file):
        eps = list(range(first, min(first + per_file, n_eps)))
        file_i = first // per_file
        where = {"chunk_index": file_i // chunks, "file_index": file_i % chunks}
        path = root / source_paths.LEROBOT_V3_DATA_PATH.format(**where)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(_with_meta(pa.concat_tables([tables[e] for e in eps]), hf_meta), path)
        for ci, cam in enumerate(cam_order):
            if cam in video_cams:
                frames = (f for e in eps for f in _frames(ci, cam in blank_cameras, e, starts[e], lengths[e],
                                                          *sizes[cam], seed, detail))
                encode_video(root / source_paths.LEROBOT_V3_VIDEO_PATH.format(video_key=cam, **where), frames, fps,
                             codec)
        offset = 0
        for e in eps:
            row = {"episode_index": e, "tasks": [tasks[ep_task[e]]], "length": lengths[e],
                   "data/chunk_index": where["chunk_index"], "data/file_index": where["file_index"],
                   "dataset_from_index": starts[e], "dataset_to_index": starts[e] + lengths[e]}
            for cam in video_cams:
                row.update({f"videos/{cam}/chunk_index": where["chunk_index"],
                            f"videos/{cam}/file_index": where["file_index"],
                            f"videos/{cam}/from_timestamp": offset / fps,
                            f"videos/{cam}/to_timestamp": (offset + lengths[e]) / fps})
            row.update({"meta/episodes/chunk_index": where["chunk_index"],
                        "meta/episodes/file_index": where["file_index"]})
            rows.append(row)
            offset += lengths[e]
    # episode metadata: one file per data file, like the data (exercises multi-file reading)
    for key in sorted({(r["meta/episodes/chunk_index"], r["meta/episodes/file_index"]) for r in rows}):
        part = [r for r in rows if (r["meta/episodes/chunk_index"], r["meta/episodes/file_index"]) == key]
        path = root / source_paths.LEROBOT_V3_EPISODES_PATH.format(chunk_index=key[0], file_index=key[1])
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(part), path)
    if task_column:
        table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()), task_column: list(tasks)})
    else:  # what pandas writes for DataFrame({"task_index": [...]}, index=[task texts])
        pandas_meta = {"index_columns": [source_paths.PANDAS_INDEX_COLUMN], "column_indexes": [],
                       "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                                    "numpy_type": "int64", "metadata": None},
                                   {"name": None, "field_name": source_paths.PANDAS_INDEX_COLUMN,
                                    "pandas_type": "unicode", "numpy_type": "object", "metadata": None}],
                       "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.3"}
        table = pa.table({"task_index": pa.array(range(len(tasks)), pa.int64()),
                          source_paths.PANDAS_INDEX_COLUMN: list(tasks)})
        table = table.replace_schema_metadata({b"pandas": json.dumps(pandas_meta).encode()})
    pq.write_table(table, root / source_paths.LEROBOT_V3_TASKS)
