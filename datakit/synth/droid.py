"""Synthetic raw DROID episodes: <root>/<lab>/success/<date>/<time>/ with metadata_*.json,
trajectory.h5 and recordings/MP4/<serial>.mp4 per camera.

Episode e (in sorted folder order) has state = synth_state(e, T, 8) (7 joints + gripper) and
action = synth_action(e, T, 8); every video frame carries the dataset-wide frame index as a
barcode (`read_frame_number`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from datakit import source_paths
from datakit.synth.lerobot import camera_seed, synth_action, synth_state
from datakit.synth.video import encode_video, synth_frame

DROID_LAB = "AUTOLab"
DROID_TASKS = ("put the marker in the cup", "close the top drawer")
# metadata serial key -> (serial, prefix of the *_mp4_path / *_svo_path keys)
_SERIALS = {"wrist_cam_serial": ("13842207", "wrist"), "ext1_cam_serial": ("22008760", "ext1"),
            "ext2_cam_serial": ("24400334", "ext2")}


def droid_episode_folder(episode: int) -> str:
    """Folder of episode `episode` relative to root (sorted order == episode order, e < 60)."""
    return f"{DROID_LAB}/success/2023-07-07/Fri_Jul__7_10:{episode:02d}:46_2023"


def make_droid_dataset(root, *, episode_lengths=(20, 26), height=72, width=128, fps=15, codec="h264",
                       missing_ext2=False, seed=0, tasks=DROID_TASKS) -> Path:
    """Write raw DROID episodes under `root` (replaced if present) and return root. With
    `missing_ext2`, the last episode has no second exterior camera (null serial/paths, no mp4)."""
    import h5py

    root = Path(root)
    if root.exists():
        shutil.rmtree(root)
    start = 0
    for e, n in enumerate(episode_lengths):
        rel = droid_episode_folder(e)
        folder = root / rel
        (folder / source_paths.DROID_MP4_DIR).mkdir(parents=True)
        rel_in_lab = rel.split("/", 1)[1]  # DROID paths in metadata are relative to <lab>/
        stamp = f"2023-07-07-10h-{e:02d}m-46s"
        uuid = f"{DROID_LAB}+{seed * 7919 + e:08x}+{stamp}"
        task = tasks[e % len(tasks)]
        meta = {"uuid": uuid, "lab": DROID_LAB, "user": "Synthetic User", "user_id": "synth",
                "date": "2023-07-07", "timestamp": stamp, "building": "synthetic", "scene_id": 1,
                "success": True, "robot_serial": "panda-synthetic", "r2d2_version": "1.3",
                "current_task": task, "trajectory_length": n,
                "hdf5_path": f"{rel_in_lab}/{source_paths.DROID_TRAJECTORY}"}
        for ci, (cam, key) in enumerate(source_paths.DROID_CAMERAS.items()):
            serial, prefix = _SERIALS[key]
            missing = missing_ext2 and key == "ext2_cam_serial" and e == len(episode_lengths) - 1
            meta[key] = None if missing else serial
            meta[f"{prefix}_cam_extrinsics"] = [0.1 * ci, -0.2, 0.3, 0.0, 0.5, -1.5]
            mp4 = f"{source_paths.DROID_MP4_DIR}/{source_paths.DROID_MP4_NAME.format(serial=serial)}"
            meta[f"{prefix}_svo_path"] = None if missing else f"{rel_in_lab}/recordings/SVO/{serial}.svo"
            meta[f"{prefix}_mp4_path"] = None if missing else f"{rel_in_lab}/{mp4}"
            if not missing:
                frames = (synth_frame(start + i, height, width, camera_seed(seed, ci, e)) for i in range(n))
                encode_video(folder / mp4, frames, fps, codec)
        meta["left_mp4_path"], meta["right_mp4_path"] = meta["ext1_mp4_path"], meta["ext2_mp4_path"]
        (folder / f"metadata_{uuid}.json").write_text(json.dumps(meta, indent=1))

        state = synth_state(e, n, source_paths.DROID_NUM_JOINTS + 1, seed).astype(np.float64)
        action = synth_action(e, n, source_paths.DROID_NUM_JOINTS + 1, seed).astype(np.float64)
        with h5py.File(folder / source_paths.DROID_TRAJECTORY, "w") as h5:
            h5.attrs["current_task"] = task
            h5.attrs["success"] = True
            h5.create_dataset(source_paths.DROID_STATE_JOINTS, data=state[:, :7])
            h5.create_dataset(source_paths.DROID_STATE_GRIPPER, data=state[:, 7])
            h5.create_dataset(source_paths.DROID_ACTION_JOINTS, data=action[:, :7])
            h5.create_dataset(source_paths.DROID_ACTION_GRIPPER, data=action[:, 7])
            t_ns = (1_688_724_000_000_000_000 + np.arange(n) * round(1e9 / fps)).astype(np.int64)
            h5.create_dataset("observation/timestamp/robot_state/robot_timestamp_seconds", data=t_ns // 10**9)
            h5.create_dataset("observation/timestamp/robot_state/robot_timestamp_nanos", data=t_ns % 10**9)
        start += n
    return root
