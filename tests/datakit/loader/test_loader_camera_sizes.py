"""Cameras of different sizes, end to end through the loader (issue 26, item 1).

The dataset is the held-out-like case: LeRobot v3.0, a 120x160 scene camera, a 96x128 wrist camera
and a blank one, converted as it is (no --resize). Oracles, none of them the loader's code:
- PyAV's decode of the source videos (`helpers.pyav_decode_all`): the frames each camera stores;
- torch's `F.interpolate` of those decoded frames: each view's resize to the model's input, the
  stretch (bilinear, antialiased) and LeRobot's / openpi's resize-with-pad, written here from its
  definition (`lerobot/policies/common/vla_utils.py::resize_with_pad_torch`);
- LeRobot 0.6.1's `resize_with_pad_torch` itself, in its venv (skipped without it).
Each comparison has a positive control: a wrong resize, padding or frame must fail it.
"""
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import pyav_decode_all
from loader_fixtures import CAMS, SIZES, shards_rgb, sizes_nv12, sizes_rgb  # noqa: F401 - fixtures

from datakit import source_paths
from datakit.loader import LeRobotView, LoaderConfig, ShardDataset, ShardLoader, lerobot_config, slot_images
from datakit.reader import open_shards

LEROBOT_PY = Path("/tmp/lerobot-venv/bin/python")
ORACLE = Path(__file__).resolve().parents[3] / "tools" / "lerobot_oracle" / "lerobot_oracle.py"
needs_lerobot = pytest.mark.skipif(not (LEROBOT_PY.parents[1] / ".ready").exists(),
                                   reason="no lerobot venv at /tmp/lerobot-venv (make lerobot-oracle)")
REAL = CAMS[:2]  # the two real cameras (CAMS[2] is blank)
UNIT = dict(image_mean=(0.0, 0.0, 0.0), image_std=(1.0, 1.0, 1.0), image_dtype="float32")  # output = pixels / 255
SCALE = torch.tensor(1.0, dtype=torch.float32) / 255.0  # the normaliser's scale 1 / (255 * std), in float32


@pytest.fixture(scope="module")
def decoded(sizes_rgb):
    """camera -> (rows, H, W, 3) uint8: the source videos as PyAV decodes them (one v3.0 file per
    camera holds every episode, so video frame i is dataset row i)."""
    src, _ = sizes_rgb
    return {cam: pyav_decode_all(src / source_paths.LEROBOT_V3_VIDEO_PATH.format(video_key=cam, chunk_index=0,
                                                                                file_index=0)) for cam in CAMS}


def chw(frame: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 -> (1, 3, H, W) float32 in [0, 255]."""
    return torch.from_numpy(np.array(frame)).permute(2, 0, 1)[None].float()


def stretch(frame: np.ndarray, size: tuple[int, int], antialias: bool = True) -> torch.Tensor:
    return F.interpolate(chw(frame), size=size, mode="bilinear", align_corners=False, antialias=antialias)


def resize_with_pad(frame: np.ndarray, size: tuple[int, int], centred: bool = True) -> torch.Tensor:
    """LeRobot 0.6.1's Pi0.5 resize (`resize_with_pad_torch`), as its source defines it: scale by
    1 / max(w / W, h / H), sizes cut to int, bilinear without antialias, clamped, black padding centred
    (the odd pixel bottom / right). `centred=False`: smolvla's top-left padding (a positive control)."""
    x = chw(frame)
    h, w = x.shape[-2:]
    height, width = size
    ratio = max(w / width, h / height)
    rh, rw = int(h / ratio), int(w / ratio)
    y = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 255.0)
    if not centred:
        return F.pad(y, (width - rw, 0, height - rh, 0))
    top, left = (height - rh) // 2, (width - rw) // 2
    return F.pad(y, (left, width - rw - left, top, height - rh - top))


def host_batches(out: Path, steps: int, **kw) -> list[dict[str, torch.Tensor]]:
    loader = ShardLoader(out, LoaderConfig(batch_size=5, seed=3, **kw))
    batches = []
    for batch in loader:
        batches.append({k: v.clone() for k, v in batch.items()})
        if len(batches) == steps:
            break
    loader.close()
    return batches


# --- the host batch: each camera at its stored size -------------------------------------------------
@pytest.mark.parametrize("workers,lend", [(0, True), (2, True), (2, False)])
def test_host_batches_carry_each_camera_at_its_stored_size(sizes_rgb, decoded, workers, lend):
    _, out = sizes_rgb
    for batch in host_batches(out, 3, num_workers=workers, lend_batches=lend):
        assert "images" not in batch and batch["slot_index"].tolist() == [0, 1]  # the blank slot pruned
        views = slot_images(batch)
        assert [tuple(v.shape) for v in views] == [(5, 1, *SIZES[c], 3) for c in REAL]
        for j, cam in enumerate(REAL):
            for i, row in enumerate(batch["row"].tolist()):
                got = views[j][i, 0].numpy()
                assert np.array_equal(got, decoded[cam][row]), (cam, row)
                assert not np.array_equal(got, decoded[cam][row + 1 if row == 0 else row - 1])  # control


def test_workers_and_the_main_process_give_the_same_mixed_batches(sizes_rgb):
    _, out = sizes_rgb
    kw = dict(frame_offsets=(-2, 0), prune_slots=False)
    for a, b in zip(host_batches(out, 4, num_workers=0, **kw), host_batches(out, 4, num_workers=2, **kw)):
        assert a.keys() == b.keys() and {"images.0", "images.1", "images.2"} <= a.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k


def test_nv12_and_windows_equal_the_reader(sizes_nv12):
    _, out = sizes_nv12
    ds = ShardDataset(out, LoaderConfig(frame_offsets=(-3, -1, 0), prune_slots=False))
    reader = open_shards(out)
    batch = ds.read_batch(list(range(0, len(ds), 4)))
    views = slot_images(batch)
    assert [tuple(v.shape[2:]) for v in views] == [(SIZES[c][0] * 3 // 2, SIZES[c][1]) for c in CAMS]
    for j, cam in enumerate(CAMS):
        for i, (ep, f) in enumerate(zip(batch["episode_index"].tolist(), batch["frame_index"].tolist())):
            n = next(e.length for e in reader.index.episodes if e.episode_index == ep)
            for t, o in enumerate((-3, -1, 0)):
                want = reader.read_raw(reader.row(ep, min(max(f + o, 0), n - 1)), cam)
                assert np.array_equal(views[j][i, t].numpy(), want), (cam, ep, f, o)


def test_cameras_of_one_size_keep_the_one_images_tensor(shards_rgb):
    """When every camera shares a size the batch is what it always was: one (B, K, T, H, W, 3) tensor."""
    ds = ShardDataset(shards_rgb, LoaderConfig())
    batch = ds.read_batch([0, 1, 2])
    assert ds.stacked and not [k for k in batch if k.startswith("images.")]
    assert batch["images"].shape == (3, 2, 1, 32, 64, 3)
    assert [v.data_ptr() for v in slot_images(batch)] == [batch["images"][:, j].data_ptr() for j in range(2)]


def test_a_skipped_shard_compacts_every_slot(sizes_rgb, tmp_path):
    """on_error="skip" drops a bad shard's samples from each per-slot tensor alike (workers too)."""
    import shutil

    _, out = sizes_rgb
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    reader = open_shards(out)
    bad = reader.index.shards[1]
    (copy / bad.name).write_bytes((copy / bad.name).read_bytes()[: bad.bytes // 2])  # truncated
    for workers in (0, 1):
        loader = ShardLoader(copy, LoaderConfig(batch_size=8, shuffle="sequential", on_error="skip",
                                                num_workers=workers, drop_last=False))
        rows = []
        for batch in loader:
            views = slot_images(batch)
            assert {v.shape[0] for v in views} == {batch["row"].numel()}
            for j, cam in enumerate(REAL):
                for i, r in enumerate(batch["row"].tolist()):
                    assert np.array_equal(views[j][i, 0].numpy(), reader.read_raw(r, cam)), (workers, cam, r)
            rows += batch["row"].tolist()
        loader.close()
        assert 0 < len(rows) < sum(e.length for e in reader.index.episodes)


# --- the device batch: each view resized from its own size, then stacked ---------------------------
@pytest.mark.parametrize("mode,size", [("stretch", (48, 48)), ("stretch", (64, 96)), ("pad", (48, 48)),
                                       ("pad", (51, 77)), ("pad", (120, 160))])
def test_device_views_equal_an_independent_resize_of_the_decoded_frames(sizes_rgb, decoded, mode, size):
    _, out = sizes_rgb
    cfg = LoaderConfig(batch_size=4, seed=1, resize=size, resize_mode=mode, pin_memory=False, **UNIT)
    loader = ShardLoader(out, cfg)
    oracle = stretch if mode == "stretch" else resize_with_pad
    # positive controls: a wrong resize, padding or frame, which the comparison must tell apart
    controls = {"no antialias": lambda f: stretch(f, size, antialias=False)} if mode == "stretch" else {
        "stretch": lambda f: stretch(f, size), "top-left padding": lambda f: resize_with_pad(f, size, False)}
    told_apart = dict.fromkeys([*controls, "another frame"], 0)
    for batch in loader.device_batches("cpu", steps=3):
        images = batch["images"]
        assert images.shape == (4, 2, 1, 3, *size) and images.dtype == torch.float32
        for i, row in enumerate(batch["row"].tolist()):
            for j, cam in enumerate(REAL):
                frame = decoded[cam][row]
                assert torch.equal(images[i, j, 0], oracle(frame, size)[0] * SCALE), (mode, size, cam, row)
                for name, wrong in controls.items():
                    told_apart[name] += not torch.equal(images[i, j, 0], wrong(frame)[0] * SCALE)
                other = decoded[cam][row - 1 if row else row + 1]
                told_apart["another frame"] += not torch.equal(images[i, j, 0], oracle(other, size)[0] * SCALE)
    loader.close()
    # a 96x128 view resized with pad into 120x160 fills it (no padding: top-left is centred), and the
    # 120x160 view is not resized at all. Every other case tells each control apart in every view.
    if size == SIZES[CAMS[0]]:
        assert told_apart["another frame"] == 24 and told_apart["stretch"] == 12 and told_apart["top-left padding"] == 0
    else:
        assert set(told_apart.values()) == {24}, told_apart


def test_pad_resize_is_lerobots_own_on_the_scene_and_wrist_views(sizes_rgb, decoded, tmp_path):
    """The device views against LeRobot 0.6.1's `resize_with_pad_torch` run in its venv, on the
    frames in [0, 1] as LeRobot holds them: equal to float32 rounding (LeRobot resizes x / 255, the
    loader resizes x and scales after), and a different resize is 100x further off."""
    if not (LEROBOT_PY.parents[1] / ".ready").exists():
        pytest.skip("no lerobot venv at /tmp/lerobot-venv (make lerobot-oracle)")
    _, out = sizes_rgb
    size = (51, 77)
    loader = ShardLoader(out, LoaderConfig(batch_size=4, seed=2, resize=size, resize_mode="pad", pin_memory=False,
                                           **UNIT))
    batch = next(loader.device_batches("cpu", steps=1))
    loader.close()
    rows = batch["row"].tolist()
    src = {cam: np.stack([decoded[cam][r] for r in rows]).transpose(0, 3, 1, 2).astype(np.float32) / 255.0
           for cam in REAL}
    np.savez(tmp_path / "in.npz", **{f"cam{j}": src[c] for j, c in enumerate(REAL)})
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), "resize", str(tmp_path / "in.npz"), str(tmp_path / "out.npz"),
                           "--size", *map(str, size)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    want = np.load(tmp_path / "out.npz")
    for j, cam in enumerate(REAL):
        got = batch["images"][:, j, 0].numpy()
        lerobot = want[f"cam{j}"]
        assert got.shape == lerobot.shape == (4, 3, *size)
        assert np.abs(got - lerobot).max() < 1e-6, cam
        stretched = torch.cat([stretch(decoded[cam][r], size) for r in rows]).numpy() / 255.0
        assert np.abs(stretched - lerobot).max() > 1e-4  # control: the stretch is not LeRobot's resize


def test_views_keep_their_sizes_without_a_resize(sizes_rgb, decoded):
    """No resize: each slot normalised at its own size, one tensor per slot."""
    _, out = sizes_rgb
    loader = ShardLoader(out, LoaderConfig(batch_size=3, pin_memory=False, **UNIT))
    batch = next(loader.device_batches("cpu", steps=1))
    loader.close()
    assert "images" not in batch
    views = slot_images(batch)
    assert [tuple(v.shape) for v in views] == [(3, 1, 3, *SIZES[c]) for c in REAL]
    for j, cam in enumerate(REAL):
        for i, row in enumerate(batch["row"].tolist()):
            assert torch.equal(views[j][i, 0], chw(decoded[cam][row])[0] * SCALE)


def test_tiled_views_of_different_sizes_are_resized_to_the_cell_first(sizes_rgb, decoded):
    """DreamZero's canvas: each view stretched to the cell (its slot size) before tiling."""
    from datakit.loader.tiling import tile_views

    _, out = sizes_rgb
    cell = (32, 64)
    cfg = LoaderConfig(batch_size=2, tile="wrist_top", prune_slots=False, slots=(CAMS[1], CAMS[0], CAMS[2]),
                       resize=cell, pin_memory=False, **UNIT)
    loader = ShardLoader(out, cfg)
    batch = next(loader.device_batches("cpu", steps=1))
    loader.close()
    assert batch["images"].shape == (2, 1, 1, 3, 64, 128)
    reader = open_shards(out)
    for i, row in enumerate(batch["row"].tolist()):
        views = [stretch(decoded[c][row], cell) if c != CAMS[2] else stretch(reader.read_raw(row, c), cell)
                 for c in cfg.slots]
        want = tile_views(torch.stack(views, dim=1)[:, :, None], "wrist_top")[0, 0, 0] * SCALE
        assert torch.equal(batch["images"][i, 0, 0], want)
    with pytest.raises(ValueError, match=r"tile='wrist_top' needs views of one size, got 120x160, 96x128; set "
                                         r"resize=\(H, W\)"):
        next(ShardLoader(out, LoaderConfig(batch_size=2, tile="wrist_top", prune_slots=False, pin_memory=False))
             .device_batches("cpu", steps=1))


def test_unequal_window_lengths_say_what_to_do(sizes_rgb):
    _, out = sizes_rgb
    with pytest.raises(ValueError, match=r"read \[1, 2\] frames each \(camera_offsets\); give every slot camera the "
                                         r"same number of frame offsets"):
        ShardDataset(out, LoaderConfig(camera_offsets={CAMS[1]: (-1, 0)}))


# --- LeRobotView: each camera at its stored size, as LeRobotDataset returns it ------------------------
def test_lerobot_view_returns_each_camera_at_its_stored_size(sizes_rgb, decoded):
    _, out = sizes_rgb
    view = LeRobotView(out)
    for i in (0, 7, 30, 80):
        item = view[i]
        for cam in REAL:
            assert item[cam].shape == (3, *SIZES[cam])
            assert torch.equal(item[cam], chw(decoded[cam][i])[0] / 255.0)
        assert item[CAMS[2]].shape == (3, *SIZES[CAMS[2]])
    batch = next(iter(torch.utils.data.DataLoader(view, batch_size=4)))  # the default collate
    assert batch[CAMS[0]].shape == (4, 3, 120, 160) and batch[CAMS[1]].shape == (4, 3, 96, 128)


@needs_lerobot
def test_lerobot_view_equals_stock_lerobot_dataset_on_mixed_sizes(sizes_rgb, tmp_path):
    src, out = sizes_rgb
    delta = {"action": [i / 10 for i in range(4)], **{cam: [-0.1, 0.0] for cam in CAMS}}
    indices = [0, 5, 24, 70, 80]
    npz = tmp_path / "items.npz"
    done = subprocess.run([str(LEROBOT_PY), str(ORACLE), "items", str(src), str(npz), "--indices",
                           *map(str, indices), "--delta", json.dumps(delta)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    want = np.load(npz)
    view = LeRobotView(out, lerobot_config(10.0, delta))
    for i in indices:
        got = view[i]
        for cam in CAMS:
            assert got[cam].shape == want[f"{i}/{cam}"].shape, (i, cam)
            diff = np.abs(got[cam].numpy() - want[f"{i}/{cam}"])  # both decode one AV1 stream: decoder rounding
            assert diff.mean() < 1.5 / 255 and diff.max() < 16 / 255, (i, cam, diff.mean(), diff.max())
            assert np.array_equal(got[f"{cam}_is_pad"].numpy(), want[f"{i}/{cam}_is_pad"])


# --- the CUDA path: per-slot tensors copied from the page-locked ring, resized on the GPU ------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fixture,workers", [("sizes_rgb", 2), ("sizes_rgb", 0), ("sizes_nv12", 2)])
def test_gpu_views_equal_the_cpu_ones(request, fixture, workers):
    """Workers' registered ring (per-slot views of one page-locked buffer), the single-process pinned
    ring, and nv12: the GPU batch equals the CPU normaliser's to float32 rounding of the resize kernels."""
    _, out = request.getfixturevalue(fixture)
    for mode in ("stretch", "pad"):
        cfg = LoaderConfig(batch_size=4, num_workers=workers, resize=(48, 48), resize_mode=mode, **UNIT)
        cpu = list(ShardLoader(out, cfg).device_batches("cpu", steps=5))
        gpu = list(ShardLoader(out, cfg).device_batches("cuda", steps=5))
        for c, g in zip(cpu, gpu):
            assert g["images"].is_cuda and g["images"].shape == c["images"].shape == (4, 2, 1, 3, 48, 48)
            assert torch.equal(c["row"], g["row"].cpu())
            assert (g["images"].cpu() - c["images"]).abs().max() < 1e-5
