"""`datakit encode --slots A,B,C --tile wrist_top`: the clip encoded is the loader's own tiled canvas
of the same frames (cameras stored at two sizes, each view stretched to its cell), bit for bit in
float32; the slots and tiling are in the fingerprint (a rerun with other slots is refused); verify
passes; bad flag combinations exit 2 with one line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from encode_fixtures import encoders  # noqa: F401
from datakit.cli import main
from datakit.encode import EncodeConfig, encode
from datakit.errors import OutputError
from datakit.loader import LoaderConfig, ShardDataset
from datakit.loader.features import FeatureDataset
from datakit.loader.normalise import Normaliser
from datakit.verify import verify

CAMS = ("observation.images.wrist", "observation.images.exterior_1", "observation.images.exterior_2")
CANVAS = (64, 128)  # cells 32x64: the wrist view stays as stored, the exterior views (48x96) are stretched
FRAMES = 5


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """2 episodes (11, 9 frames) of 3 PNG cameras: the wrist 32x64, the exteriors 48x96."""
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.synth import make_lerobot_dataset

    root = tmp_path_factory.mktemp("tile_src")
    src = make_lerobot_dataset(root / "src", version="v2.1", episode_lengths=(11, 9), height=48, width=96,
                               cameras=CAMS, image_cameras=CAMS, blank_cameras=(), camera_sizes={CAMS[0]: (32, 64)},
                               state_dim=4, action_dim=3)
    convert(src, root / "out", ConvertConfig(workers=1, progress=False))
    return root / "out"


def _cfg(encoders, **kw) -> EncodeConfig:  # noqa: F811
    kw = {"slots": CAMS, "image_encoder": encoders["image"], **kw}
    return EncodeConfig(vae=encoders["wan2.2"], frames=FRAMES, size=CANVAS, tile="wrist_top", dtype="float32",
                        progress=False, **kw)


@pytest.fixture(scope="module")
def tiled(encoders, source, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("tiled") / "f"
    encode(source, out, _cfg(encoders))
    return out


def _loader_canvases(source: Path, clips: list[tuple[int, int]], resize_mode: str = "stretch") -> torch.Tensor:
    """(N, 3, T, H, W): the loader's float32 canvas of each clip, as DreamZero's loader config reads
    it from frames (the clip's last frame the anchor, the frames before it the window)."""
    cfg = LoaderConfig(slots=CAMS, tile="wrist_top", prune_slots=False, resize=(CANVAS[0] // 2, CANVAS[1] // 2),
                       resize_mode=resize_mode, frame_offsets=tuple(range(1 - FRAMES, 1)), image_dtype="float32")
    ds = ShardDataset(source, cfg)
    row_start = {e.episode_index: e.row_start for e in ds.index.episodes}
    anchors = ds.anchors.tolist()
    positions = [anchors.index(row_start[ep] + start + FRAMES - 1) for ep, start in clips]
    batch = ds.read_batch(positions)
    assert "images.0" in batch  # the cameras differ in size: one tensor per slot, as a trainer's batch
    images = Normaliser.from_index(ds.index, cfg)(batch)["images"]
    ds.close()
    assert images.shape[1:] == (1, FRAMES, 3, *CANVAS)
    return images[:, 0].permute(0, 2, 1, 3, 4)


def test_tiled_clip_is_the_vae_of_the_loaders_canvas(tiled, encoders, source):  # noqa: F811
    """Latents: the VAE of the loader's canvas; CLIP features: of its first frame at 8 bits."""
    from diffusers import AutoencoderKLWan
    from transformers import CLIPImageProcessor, CLIPVisionModel

    from datakit.encode.canvas import canvas_frame_u8

    vae = AutoencoderKLWan.from_pretrained(encoders["wan2.2"]).eval()
    clip = CLIPVisionModel.from_pretrained(encoders["image"]).eval()
    proc = CLIPImageProcessor.from_pretrained(encoders["image"])
    ds = FeatureDataset(tiled, LoaderConfig())
    samples = [ds[i] for i in range(len(ds))]
    ds.close()
    assert len(samples) == 3  # 11 // 5 + 9 // 5 clips
    clips = [(int(s["episode_index"]), int(s["start"])) for s in samples]
    x = _loader_canvases(source, clips)
    other = _loader_canvases(source, clips, "bicubic")  # positive control: another resize of the same views
    with torch.no_grad():
        for k, s in enumerate(samples):
            assert s["latents"].shape == (6, 2, 4, 8)
            assert torch.equal(s["latents"], vae.encode(x[k : k + 1]).latent_dist.mode()[0])
            assert not torch.equal(s["latents"], vae.encode(other[k : k + 1]).latent_dist.mode()[0])
            frame0 = ((x[k, :, 0] + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
            assert np.array_equal(frame0, canvas_frame_u8(x[k, :, 0]))
            pix = proc(images=[frame0], return_tensors="pt")["pixel_values"]
            assert torch.equal(s["image"], clip(pixel_values=pix, output_hidden_states=True).hidden_states[-2][0])
    fp = ds.index.fingerprint
    assert fp["slots"] == list(CAMS) and fp["tile"] == "wrist_top" and fp["camera"] is None
    assert fp["size"] == list(CANVAS) and fp["resize"] == "stretch"


def test_rerun_with_other_slots_is_refused(tiled, encoders, source, tmp_path):  # noqa: F811
    assert encode(source, tiled, _cfg(encoders)).already_complete
    with pytest.raises(OutputError, match="slots"):
        encode(source, tiled, _cfg(encoders, slots=(CAMS[1], CAMS[0], CAMS[2])))
    with pytest.raises(OutputError, match="made otherwise"):  # an untiled run into the tiled folder
        encode(source, tiled, EncodeConfig(vae=encoders["wan2.2"], image_encoder=encoders["image"], frames=FRAMES,
                                           size=CANVAS, camera=CAMS[0], dtype="float32", progress=False))


def test_verify_passes_on_the_tiled_folder(tiled):
    report = verify(tiled)
    assert report.ok, report.problems


def test_cli_tiles_and_refuses_bad_flags_in_one_line(encoders, source, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "f"
    base = ["encode", str(source), str(out), "--vae", str(encoders["wan2.2"]), "--clip", "5", "--dtype", "float32",
            "--no-progress"]
    assert main([*base, "--slots", ",".join(CAMS), "--tile", "wrist_top", "--size", "64x128"]) == 0
    capsys.readouterr()
    bad = [(["--slots", ",".join(reversed(CAMS)), "--tile", "wrist_top", "--size", "64x128"], "slots"),
           (["--slots", ",".join(CAMS)], "--tile"),
           (["--slots", ",".join(CAMS[:2]), "--tile", "wrist_top"], "3 distinct"),
           (["--slots", ",".join(CAMS), "--tile", "wrist_top", "--camera", CAMS[0]], "--camera"),
           (["--slots", ",".join(CAMS), "--tile", "grid"], "wrist_top"),
           (["--slots", ",".join(CAMS), "--tile", "wrist_top", "--size", "63x128"], "even"),
           (["--tile", "wrist_top"], "different sizes")]  # no --size: the cameras' sizes differ
    for flags, what in bad:
        assert main([*base, *flags]) == 2, flags
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and what in err, (flags, err)


def test_clips_need_one_real_slot():
    """A canvas keeps an episode with some slots not real (the loader fills their cells); an episode
    with no real slot gives no clip; one camera still needs that camera real."""
    from types import SimpleNamespace

    from datakit.encode.clips import plan_clips

    status = [dict.fromkeys(CAMS, "real"), {**dict.fromkeys(CAMS, "missing"), CAMS[2]: "real"},
              {CAMS[0]: "blank", CAMS[1]: "missing", CAMS[2]: "missing"}]
    index = SimpleNamespace(shards=[0], episodes=[SimpleNamespace(episode_index=e, length=5, row_start=5 * e, shard=0,
                                                                  camera_status=s) for e, s in enumerate(status)])
    tasks = np.zeros(15, np.int64)
    assert [c.episode_index for c in plan_clips(index, tasks, 5, 0, 0, CAMS)[0]] == [0, 1]
    assert [c.episode_index for c in plan_clips(index, tasks, 5, 0, 0, CAMS[:1])[0]] == [0]
