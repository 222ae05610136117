"""Source path templates: every file name and path template of the formats datakit reads (LeRobot, DROID)."""
from __future__ import annotations

# sources ------------------------------------------------------------------------------------
# LeRobot (all versions)
LEROBOT_INFO = "meta/info.json"
LEROBOT_STATS = "meta/stats.json"  # v2.0 and v3.0
LEROBOT_CHUNKS_SIZE = 1000  # default number of files per chunk folder
LEROBOT_VERSIONS = ("v2.0", "v2.1", "v3.0")
LEROBOT_STATE_KEY = "observation.state"
LEROBOT_ACTION_KEY = "action"

# LeRobot v2.0 / v2.1: one parquet per episode, one mp4 per episode and camera
LEROBOT_V2_EPISODES = "meta/episodes.jsonl"
LEROBOT_V2_TASKS = "meta/tasks.jsonl"
LEROBOT_V21_EPISODES_STATS = "meta/episodes_stats.jsonl"
LEROBOT_V2_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
LEROBOT_V2_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"

# LeRobot v3.0: several episodes per parquet / mp4 file
LEROBOT_V3_TASKS = "meta/tasks.parquet"
LEROBOT_V3_EPISODES_DIR = "meta/episodes"
LEROBOT_V3_EPISODES_GLOB = "*/*.parquet"  # below LEROBOT_V3_EPISODES_DIR
LEROBOT_V3_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
LEROBOT_V3_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
LEROBOT_V3_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
# the pandas index column under which `DataFrame(index=tasks).to_parquet` stores the task text
PANDAS_INDEX_COLUMN = "__index_level_0__"

# raw DROID: <lab>/success/<date>/<time>/{metadata_*.json, trajectory.h5, recordings/MP4/<serial>.mp4}
DROID_METADATA_GLOB = "metadata_*.json"
DROID_TRAJECTORY = "trajectory.h5"
DROID_MP4_DIR = "recordings/MP4"
DROID_MP4_NAME = "{serial}.mp4"
DROID_FPS = 15.0
# camera name -> metadata key holding that camera's serial
DROID_CAMERAS = {
    "observation.images.wrist_left": "wrist_cam_serial",
    "observation.images.exterior_1_left": "ext1_cam_serial",
    "observation.images.exterior_2_left": "ext2_cam_serial",
}
DROID_STATE_JOINTS = "observation/robot_state/joint_positions"
DROID_STATE_GRIPPER = "observation/robot_state/gripper_position"
DROID_ACTION_JOINTS = "action/joint_position"
DROID_ACTION_GRIPPER = "action/gripper_position"
DROID_NUM_JOINTS = 7
