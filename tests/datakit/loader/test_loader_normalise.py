"""Device-side normalisation against float64 numpy references; GPU == CPU on a GPU machine.

GPU tests carry `@pytest.mark.gpu` and skip when CUDA is absent.
"""
import numpy as np
import pytest
import torch

from datakit.loader import LoaderConfig, Normaliser, PinnedRing, ShardLoader, h2d_bytes
from datakit.loader.normalise import affine_from_stats
from datakit.shards.index import load_index
from loader_fixtures import shards_nv12, shards_rgb  # noqa: F401

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def np_nv12_to_rgb(nv12):
    """Independent numpy NV12 -> RGB (full-range BT.601, nearest chroma), float64, (N, H, W, 3)."""
    n, h3, w = nv12.shape
    h = h3 * 2 // 3
    y = nv12[:, :h].astype(np.float64)
    uv = nv12[:, h:].reshape(n, h // 2, w // 2, 2).astype(np.float64) - 128.0
    uv = uv.repeat(2, axis=1).repeat(2, axis=2)
    u, v = uv[..., 0], uv[..., 1]
    rgb = np.stack([y + 1.402 * v, y - 0.344136 * u - 0.714136 * v, y + 1.772 * u], axis=-1)
    return np.clip(rgb, 0, 255)


def np_reference(batch, index, cfg):
    imgs = batch["images"].numpy()
    lead = imgs.shape[:3]
    flat = imgs.reshape(-1, *imgs.shape[3:])
    rgb = np_nv12_to_rgb(flat) if index.layout == "nv12" else flat.astype(np.float64)
    mean, std = np.array(cfg.image_mean), np.array(cfg.image_std)
    x = ((rgb / 255.0 - mean) / std).transpose(0, 3, 1, 2)
    out = {"images": x.reshape(*lead, *x.shape[1:])}
    for key in ("state", "action"):
        st = {k: np.array(v) for k, v in index.stats[key].items()}
        v = batch[key].numpy().astype(np.float64)
        if cfg.norm == "mean_std":
            out[key] = (v - st["mean"]) / st["std"]
        else:
            out[key] = 2 * (v - st["q01"]) / (st["q99"] - st["q01"]) - 1
    return out


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("fixture", ["shards_rgb", "shards_nv12"])
@pytest.mark.parametrize("norm,dtype,tol", [("mean_std", "float32", 1e-6), ("quantile", "bfloat16", 8e-3)])
def test_cpu_normalisation_matches_numpy(request, fixture, norm, dtype, tol):
    root = request.getfixturevalue(fixture)
    cfg = LoaderConfig(norm=norm, image_dtype=dtype, batch_size=16, action_horizon=4,
                       image_mean=(0.485, 0.456, 0.406), image_std=(0.229, 0.224, 0.225))
    loader = ShardLoader(root, cfg)
    host = next(iter(loader))
    index = load_index(root)
    got = Normaliser.from_index(index, cfg)(host)
    want = np_reference(host, index, cfg)
    assert got["images"].dtype == getattr(torch, dtype)
    assert got["images"].shape == (*host["images"].shape[:3], 3, 32, 64)
    assert rel(got["images"].float(), want["images"]) < tol
    for key in ("state", "action"):
        assert rel(got[key], want[key]) < 1e-6


def test_resize_crop_and_jitter_are_deterministic(shards_rgb):
    cfg = LoaderConfig(resize=(40, 80), crop=(32, 48), random_crop=True, colour_jitter=0.3, seed=4,
                       image_dtype="float32", batch_size=8)
    host = next(iter(ShardLoader(shards_rgb, cfg)))
    norm = Normaliser.from_index(load_index(shards_rgb), cfg)
    a = norm(host, epoch=0, step=3)
    assert a["images"].shape[-3:] == (3, 32, 48)
    assert torch.equal(a["images"], norm(host, epoch=0, step=3)["images"])
    assert not torch.equal(a["images"], norm(host, epoch=1, step=3)["images"])
    plain = Normaliser.from_index(load_index(shards_rgb), LoaderConfig(image_dtype="float32"))(host)
    assert rel(plain["images"], np_reference(host, load_index(shards_rgb), LoaderConfig())["images"]) < 1e-6


def test_affine_stats():
    stats = {"mean": [1.0, -2.0], "std": [2.0, 0.5], "q01": [0.0, -1.0], "q99": [4.0, 1.0]}
    x = torch.tensor([[3.0, -1.0], [0.0, 1.0]])
    s, b = affine_from_stats(stats, "mean_std")
    assert torch.allclose(x * s + b, torch.tensor([[1.0, 2.0], [-0.5, 6.0]]))
    s, b = affine_from_stats(stats, "quantile")
    assert torch.allclose(x * s + b, torch.tensor([[0.5, -1.0], [-1.0, 1.0]]))


def test_h2d_bytes_uint8_vs_float32_and_pruning(shards_rgb):
    cfg = LoaderConfig(batch_size=8, slots=(*[f"observation.images.{c}" for c in ("top", "wrist", "side")],))
    pruned = next(iter(ShardLoader(shards_rgb, cfg)))
    full = next(iter(ShardLoader(shards_rgb, LoaderConfig(batch_size=8, slots=cfg.slots, prune_slots=False))))
    assert pruned["images"].shape[1] == 2 and full["images"].shape[1] == 3
    assert pruned["images"].nbytes * 3 == full["images"].nbytes * 2
    assert h2d_bytes(pruned) < h2d_bytes(full)


def test_cpu_batcher_passes_batches_through_in_order(shards_rgb):
    cfg = LoaderConfig(batch_size=8, image_dtype="float32")
    loader = ShardLoader(shards_rgb, cfg)
    rows = [b["row"].tolist() for b in ShardLoader(shards_rgb, cfg)]
    assert [b["row"].tolist() for b in loader.device_batches("cpu", steps=len(rows))] == rows


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("fixture", ["shards_rgb", "shards_nv12"])
def test_gpu_equals_cpu(request, fixture):
    root = request.getfixturevalue(fixture)
    cfg = LoaderConfig(batch_size=8, image_dtype="float32", norm="quantile", resize=(48, 96), crop=(40, 80),
                       colour_jitter=0.2)
    cpu = [b for b in ShardLoader(root, cfg).device_batches("cpu", steps=12)]
    gpu = [b for b in ShardLoader(root, cfg).device_batches("cuda", steps=12)]
    assert len(cpu) == len(gpu)
    for c, g in zip(cpu, gpu):
        assert g["images"].is_cuda
        assert torch.equal(c["row"], g["row"].cpu())
        assert rel(g["images"].cpu(), c["images"]) < 1e-5
        assert rel(g["action"].cpu(), c["action"]) < 1e-6


@pytest.mark.gpu
@cuda
def test_gpu_matches_numpy_bf16(shards_nv12):
    cfg = LoaderConfig(batch_size=16, image_dtype="bfloat16")
    for host, dev in zip(ShardLoader(shards_nv12, cfg), ShardLoader(shards_nv12, cfg).device_batches("cuda")):
        want = np_reference(host, load_index(shards_nv12), cfg)
        assert rel(dev["images"].float().cpu(), want["images"]) < 8e-3


@pytest.mark.gpu
@cuda
def test_pinned_ring_reuses_buffers_after_the_copy():
    ring = PinnedRing(2)
    seen = []
    for i in range(6):
        batch = {"x": torch.full((1000,), i, dtype=torch.uint8)}
        pinned, slot = ring.stage(batch)
        assert pinned["x"].is_pinned()
        seen.append(pinned["x"].data_ptr())
        dev = pinned["x"].to("cuda", non_blocking=True)
        ev = torch.cuda.Event()
        ev.record()
        ring.release(slot, ev)
        assert int(dev[0]) == i
    assert len(set(seen)) == 2  # two buffers, reused


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 8e-3)])
def test_fused_nv12_matches_numpy_on_random_bytes(dtype, tol):
    """Random bytes drive many pixels outside [0, 255] before the clamp, which the folded
    map must clamp per channel exactly as the reference does after the colour matrix."""
    from datakit.loader.nv12 import FusedNV12
    rng = np.random.default_rng(0)
    nv12 = rng.integers(0, 256, (5, 12, 10), dtype=np.uint8)  # 5 frames of 8 x 10
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    rgb = np_nv12_to_rgb(nv12)
    want = ((rgb / 255.0 - mean) / std).transpose(0, 3, 1, 2)
    fused = FusedNV12.of(torch.tensor(1.0 / (255.0 * std), dtype=torch.float32),
                         torch.tensor(-mean / std, dtype=torch.float32))
    got = fused(torch.from_numpy(nv12), dtype)
    assert got.dtype == dtype and got.shape == (5, 3, 8, 10)
    assert rel(got.float(), want) < tol
    assert np.abs(got.float().numpy() - want).max() < (1e-5 if dtype == torch.float32 else 0.04)


def test_crop_per_sample_windows():
    """`crop_per_sample`: each sample's window is a sub-window of its frame (found by brute force),
    the same for all its views and frames, a function of its row (not of its place in the batch),
    and not one window for the whole batch."""
    cfg = LoaderConfig(crop=(5, 6), random_crop=True, crop_per_sample=True, image_dtype="float32",
                       image_mean=(0.0, 0.0, 0.0), image_std=(1.0, 1.0, 1.0), seed=3)
    norm = Normaliser(cfg=cfg, layout="rgb", image_scale=torch.full((3,), 1 / 255), image_bias=torch.zeros(3),
                      state_affine=(torch.ones(1), torch.zeros(1)), action_affine=(torch.ones(1), torch.zeros(1)))
    b, k, t, h, w = 6, 2, 2, 9, 11
    frames = torch.randint(0, 256, (b, 1, 1, h, w, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    frames = frames.expand(b, k, t, h, w, 3).contiguous()
    rows = torch.tensor([40, 7, 123, 9, 88, 5])
    out = norm.images(frames, rows) * 255  # (B, K, T, 3, 5, 6)
    src = frames[:, 0, 0].permute(0, 3, 1, 2).float()
    offsets = []
    for i in range(b):
        assert (out[i] == out[i, :1, :1]).all()  # one window for the sample's views and frames
        found = [(y, x) for y in range(h - 4) for x in range(w - 5)
                 if torch.allclose(src[i, :, y:y + 5, x:x + 6], out[i, 0, 0], atol=1e-3)]
        assert found
        offsets.append(found[0])
    assert len(set(offsets)) > 1
    flipped = norm.images(frames.flip(0), rows.flip(0)) * 255
    torch.testing.assert_close(flipped, out.flip(0))
    with pytest.raises(ValueError, match="needs random_crop"):
        LoaderConfig(crop=(5, 6), crop_per_sample=True)
