"""A feature folder (`datakit encode`) on object storage: `ShardLoader("s3://.../features", cfg)` reads it
through the node-local download cache as it reads frame shards (moto S3 server, real HTTP via s3fs).

Oracle: the same loader on the local folder the bucket was uploaded from, bit for bit, at the same sampler
positions. A shard damaged in the bucket is named in one line (or its clips skipped), as for frames."""
from __future__ import annotations

import numpy as np
import pytest

from encode_fixtures import encoders, source  # noqa: F401  (the s3 fixtures come from conftest.py)

pytest.importorskip("s3fs")

from datakit.encode import EncodeConfig, encode  # noqa: E402
from datakit.errors import ShardError  # noqa: E402
from datakit.loader import FeatureDataset, LoaderConfig, ShardLoader  # noqa: E402
from datakit.shards.features import load_features  # noqa: E402
from datakit.storage import roots  # noqa: E402
from datakit.storage.retry import RetryPolicy  # noqa: E402

FAST = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, jitter=0.0)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(roots, "DEFAULT_RETRY", FAST)


@pytest.fixture(scope="module")
def features(encoders, source, tmp_path_factory):  # noqa: F811
    """5-frame clips of every field (latents, first-frame conditioning, CLIP, text): 3 clip shards and
    the prompts' shard."""
    out = tmp_path_factory.mktemp("remote_features") / "f"
    encode(source, out, EncodeConfig(vae=encoders["wan2.1"], text_encoder=encoders["text"],
                                     image_encoder=encoders["image"], frames=5, cond="first-frame",
                                     dtype="float32", progress=False))
    return out


def _upload(features, url: str, damage: int | None = None) -> None:
    """`features` to `url` (the index files last); `damage`: flip one bit of that shard (same size)."""
    import s3fs

    from datakit.storage import transfer

    transfer.upload_output(features, url, policy=FAST)
    if damage is not None:
        name = load_features(features).shards[damage].name
        data = bytearray((features / name).read_bytes())
        data[len(data) // 2] ^= 0x01  # only the hash can tell
        s3fs.S3FileSystem().pipe(f"{url}/{name}"[len("s3://"):], bytes(data))


def _cfg(**kw) -> LoaderConfig:
    return LoaderConfig(**{**dict(batch_size=3, shuffle="shard_block", block_size=2, seed=5, pin_memory=False), **kw})


def _batches(root, cfg: LoaderConfig, n: int) -> list[dict[str, np.ndarray]]:
    loader = ShardLoader(root, cfg)
    try:
        assert isinstance(loader.dataset, FeatureDataset)
        out = []
        while len(out) < n:  # across epoch ends
            out += [{k: v.numpy().copy() for k, v in b.items()} for b in loader]  # float32 folder: numpy holds it
        return out[:n]
    finally:
        loader.close()


def _same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> bool:
    return len(got) == len(want) and all(
        g.keys() == w.keys() and all(g[k].dtype == w[k].dtype and np.array_equal(g[k], w[k]) for k in w)
        for g, w in zip(got, want))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [0, 2])
def test_remote_feature_folder_gives_the_local_batches(features, bucket, tmp_path, workers):
    url = f"{bucket}/features"
    _upload(features, url)
    index = load_features(features)
    largest = max(s.bytes for s in index.shards)
    assert 2 * largest < sum(s.bytes for s in index.shards), "the fixture needs a cache smaller than the folder"
    n = 7  # more than an epoch (7 clips, batch 3)
    want = _batches(features, _cfg(num_workers=workers), n)
    cache = tmp_path / "cache"
    got = _batches(url, _cfg(num_workers=workers, cache_dir=str(cache), cache_bytes=2 * largest), n)
    assert {"latents", "cond_latents", "image", "text", "text_mask"} <= want[0].keys()
    assert _same(got, want)
    assert sorted(p.name for p in cache.rglob("shard-*.tar"))  # the shards came through the cache
    # positive control: the comparison sees another order
    assert not _same(_batches(features, _cfg(num_workers=workers, seed=6), n), want)


@pytest.mark.timeout(120)
def test_a_damaged_remote_feature_shard_is_named_or_its_clips_skipped(features, bucket, tmp_path):
    url, bad = f"{bucket}/features", 1
    _upload(features, url, damage=bad)
    name = load_features(features).shards[bad].name
    remote = dict(cache_dir=str(tmp_path / "cache"), cache_bytes=1 << 30, verify="sha256")
    with pytest.raises(ShardError) as e:
        _batches(url, _cfg(**remote), 3)
    assert str(e.value).startswith(f"{url}/{name}: sha256 ") and "differs from the index" in str(e.value)
    assert "\n" not in str(e.value)
    loader = ShardLoader(url, _cfg(**remote, on_error="skip"))
    try:
        ds, s = loader.dataset, loader.sampler
        want_skipped = int((ds.shard[ds.anchors[s.batches(0)]] == bad).sum())
        rows = np.concatenate([b["row"].numpy() for b in loader])
        assert want_skipped > 0 and loader.num_skipped == want_skipped
        assert not (ds.shard[rows] == bad).any()
    finally:
        loader.close()
    # positive control: the same loader on the intact local folder skips nothing
    loader = ShardLoader(features, _cfg(verify="sha256", on_error="skip"))
    try:
        epoch = loader.sampler.batches(0).size
        assert sum(b["row"].numel() for b in loader) == epoch and loader.num_skipped == 0
    finally:
        loader.close()


@pytest.mark.timeout(120)
def test_verify_and_plan_read_a_remote_feature_folder_as_its_local_copy(features, bucket, capsys):
    import json

    from datakit.cli import main
    from datakit.verify import verify

    url, bad = f"{bucket}/features", 2
    _upload(features, url)
    local, remote = verify(features), verify(url)
    assert local.ok and remote.ok, remote.problems
    assert (remote.shards, remote.frames, remote.offsets_checked) == (local.shards, local.frames,
                                                                      local.offsets_checked) and local.offsets_checked
    plans = []
    for root in (features, url):
        assert main(["plan", str(root), "--samples-per-s", "10", "--json"]) == 0
        plans.append(json.loads(capsys.readouterr().out)["features"])
    assert plans[0] == plans[1] and plans[0]["num_clips"] == 7
    _upload(features, url, damage=bad)  # the same bucket, one shard flipped: named by its URL, one line
    name = load_features(features).shards[bad].name
    rep = verify(url)
    assert not rep.ok and [p.where for p in rep.problems] == [f"{url}/{name}"], rep.problems
    assert "sha256" in rep.problems[0].what and "\n" not in rep.problems[0].what
