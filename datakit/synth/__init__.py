"""The one synthetic-dataset factory (demo, tests, benchmarks): real mp4s whose frames carry their
frame number as a barcode, LeRobot v2.0/v2.1/v3.0 datasets and raw DROID folders."""
from datakit.synth.droid import DROID_TASKS, droid_episode_folder, make_droid_dataset
from datakit.synth.lerobot import camera_seed, make_lerobot_dataset, synth_action, synth_state
from datakit.synth.video import blank_frame, encode_video, read_frame_number, synth_frame

__all__ = [
    "DROID_TASKS", "blank_frame", "camera_seed", "droid_episode_folder", "encode_video",
    "make_droid_dataset", "make_lerobot_dataset", "read_frame_number", "synth_action", "synth_frame",
    "synth_state",
]
