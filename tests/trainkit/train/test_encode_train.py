"""The stand-in DreamZero family trains from a feature folder (`datakit encode`): cached latents of the
model's shape in place of its VAE stand-in, CLIP features in place of its image stand-in; a folder whose
fingerprint disagrees with the run's config (tiling, slots, clip length, size, latent shape, VAE) is refused
with one line naming both."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dreamzero_fixtures import CAMS3, shards_3cam  # noqa: F401
from encode_fixtures import encoders  # noqa: F401
from datakit.encode import EncodeConfig, encode
from trainkit.config import load_config
from trainkit.errors import DataError

CONFIGS = Path(__file__).resolve().parents[3] / "trainkit" / "configs"


def _encode(encoders, shards, out: Path, **kw) -> Path:  # noqa: F811
    encode(shards, out, EncodeConfig(vae=encoders["wan2.2"], image_encoder=encoders["image"], frames=17,
                                     size=(64, 128), dtype="float32", progress=False, **kw))
    return out


@pytest.fixture(scope="module")
def feature_folder(encoders, shards_3cam, tmp_path_factory):  # noqa: F811
    """17-frame clips of the three views tiled as the loader tiles them (wrist on top) at the tiny
    preset's 64x128 canvas: latents (6, 5, 4, 8)."""
    return _encode(encoders, shards_3cam, tmp_path_factory.mktemp("dz_features") / "f", slots=CAMS3, tile="wrist_top")


def _cfg(folder: Path, out: Path, *sets: str):
    return load_config(CONFIGS / "dreamzero_tiny.toml", [f"data.shards={folder}", f"output.dir={out}",
                                                         "train.steps=3", "train.micro_batch=2", "model.latent_channels=6",
                                                         "output.log_every=1", *sets])


def test_trains_from_cached_latents(feature_folder, tmp_path):
    from trainkit.train import run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = run(_cfg(feature_folder, tmp_path / "run"))
    finally:
        torch.set_num_threads(threads)
    assert len(res.losses) == 3 and all(math.isfinite(v) for v in res.losses.values())


@pytest.mark.parametrize("sets,what", [(("model.frames=9",), "clip frames"),
                                       (("model.view=[16, 32]",), "frame size"),
                                       (("model.latent_channels=8",), "latent shape"),
                                       (("data.features_vae=0000",), "VAE")])
def test_a_mismatched_fingerprint_is_refused_with_one_line(feature_folder, tmp_path, sets, what):
    from trainkit.train import run

    with pytest.raises(DataError) as e:
        run(_cfg(feature_folder, tmp_path / "run", *sets))
    text = str(e.value)
    assert what in text and "index.json" in text and len(text.splitlines()) == 1


def test_an_untiled_folder_is_refused(encoders, shards_3cam, tmp_path):  # noqa: F811
    """Positive control of the tiling check: the wrist camera alone at the canvas's size gives the
    same latent shape, clip length and widths; only the tiling differs, and the run refuses it."""
    from trainkit.train import run

    folder = _encode(encoders, shards_3cam, tmp_path / "f", camera=CAMS3[0])
    with pytest.raises(DataError) as e:
        run(_cfg(folder, tmp_path / "run"))
    text = str(e.value)
    assert "tiling none (one camera" in text and "wrist_top" in text and "index.json" in text
    assert len(text.splitlines()) == 1


def test_other_data_slots_are_refused(feature_folder, tmp_path):
    from trainkit.train import run

    slots = "data.slots=" + str([CAMS3[1], CAMS3[0], CAMS3[2]]).replace("'", '"')
    with pytest.raises(DataError) as e:
        run(_cfg(feature_folder, tmp_path / "run", slots))
    text = str(e.value)
    assert "data.slots" in text and "fingerprint.slots" in text and len(text.splitlines()) == 1


def test_trains_from_a_remote_feature_folder_as_from_its_local_copy(feature_folder, bucket, tmp_path):
    """`data.shards = "s3://.../features"` (moto server, the storage fixtures): the clips come through the
    node-local cache (`data.cache_dir`) and give the local folder's losses, step for step."""
    pytest.importorskip("s3fs")
    from datakit.storage import transfer
    from datakit.storage.retry import RetryPolicy
    from trainkit.train import run

    url = f"{bucket}/features"
    transfer.upload_output(feature_folder, url, policy=RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05))
    cache = tmp_path / "cache"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        local = run(_cfg(feature_folder, tmp_path / "local"))
        remote = run(_cfg(url, tmp_path / "remote", f"data.cache_dir={cache}"))
        other = run(_cfg(feature_folder, tmp_path / "other", "train.seed=1"))
    finally:
        torch.set_num_threads(threads)
    assert len(local.losses) == 3 and remote.losses == local.losses
    assert sorted(p.name for p in cache.rglob("shard-*.tar"))  # read through the cache
    assert other.losses != local.losses  # positive control: the comparison sees another run


def test_a_holdout_keeps_its_episode_out_of_training_and_validates_on_it(feature_folder, tmp_path):
    """data.val_episodes on a feature folder: the training stream never samples the held-out episode's
    clips (control: without the holdout it does), and the run logs a finite validation loss on them."""
    import json

    from datakit.shards.features import load_clips, load_features
    from trainkit.train import run

    episode = load_clips(feature_folder, load_features(feature_folder)).column("episode_index").to_numpy()
    held = int(episode[-1])

    def trained(out: Path, *sets: str) -> set[int]:
        run(_cfg(feature_folder, out, "output.record_samples=true", "train.steps=6", *sets))
        lines = (out / "samples-rank0.jsonl").read_text().splitlines()
        return {int(episode[r]) for line in lines for r in json.loads(line)["rows"]}

    assert held in trained(tmp_path / "all")
    assert held not in trained(tmp_path / "held", f"data.val_episodes=[{held}]", "train.eval_every=3",
                               "train.eval_batches=1")
    evals = [json.loads(line) for line in (tmp_path / "held" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["val_loss"] for r in evals if r.get("kind") == "eval"]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
