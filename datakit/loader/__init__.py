"""Shards to training batches: deterministic, resumable, step-granular, uint8 until the device.

Modules, in the order a sample flows through them:
config (LoaderConfig) -> anchors (which (episode, t) a window allows) -> sampler (one global
order per (seed, epoch), split by rank and step) -> dataset (batch read: numpy columns +
coalesced preadv of pixels) with slots (camera -> model image slot, pruning; `slot_images` reads a
batch's per-camera frames, stacked or one tensor per slot when the cameras differ in size) and reads
(verified shard files) -> shm_pool (workers read into reused shared-memory ring buffers) -> loader
(DataLoader, resumable state) -> gpu_batch (pinned ring, side-stream copy) -> normalise (on the
device; nv12: NV12 -> normalised RGB in two passes; resize: each view to the model's input).
interop: LeRobot-style items, WebDataset URLs. mixture (MixtureSource, the seeded source schedule) and
mixture_dataset: several shard folders with weights, one batch buffer, per-source statistics.
features: a feature folder (`datakit encode`) in place
of dataset, a clip per position, the rest of the flow unchanged.
throughput/: what a target samples/s needs of storage, cache and the bus (`datakit plan`).
"""
from datakit.loader.config import LoaderConfig, loader_config_from_toml, loader_config_to_toml
from datakit.loader.dataset import ShardDataset
from datakit.loader.features import FeatureDataset
from datakit.loader.gpu_batch import DeviceBatcher, PinnedRing, h2d_bytes
from datakit.loader.interop import LeRobotView, lerobot_config, webdataset_urls
from datakit.loader.loader import ShardLoader
from datakit.loader.mixture import MixtureSource
from datakit.loader.normalise import Normaliser
from datakit.loader.sampler import StepSampler, epoch_order
from datakit.loader.slots import slot_images

__all__ = [
    "DeviceBatcher", "LeRobotView", "FeatureDataset", "LoaderConfig", "MixtureSource", "Normaliser", "PinnedRing", "ShardDataset", "ShardLoader",
    "StepSampler", "epoch_order", "h2d_bytes", "lerobot_config", "loader_config_from_toml", "loader_config_to_toml",
    "slot_images", "webdataset_urls",
]
