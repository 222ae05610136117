"""`datakit encode` against independent oracles: diffusers' own AutoencoderKLWan.encode(...).latent_dist.mode()
on the same frames resized the same way (bit for bit, float32, CPU), transformers' umT5 / CLIP outputs on
the real tokens / the first frame; the per-clip rule; the loader's view of a feature folder; verify and
the readers' checks at open; the CLI's one-line errors. Tiny encoders from configs (encode_fixtures.py)."""
from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F

from encode_fixtures import CAMERA, encoders, source  # noqa: F401
from datakit.cli import main
from datakit.encode import EncodeConfig, encode
from feature_faults import assert_damage_is_found
from datakit.loader import LoaderConfig, ShardLoader
from datakit.loader.features import FeatureDataset
from datakit.reader import open_shards


@pytest.fixture(scope="module")
def features(encoders, source, tmp_path_factory):  # noqa: F811
    """Float32 features of 9-frame clips: Wan2.1-style with first-frame conditioning, text and CLIP;
    Wan2.2-style with the latents alone, resized to 32x32."""
    root = tmp_path_factory.mktemp("features")
    out = {}
    out["wan2.1"] = root / "wan21"
    encode(source, out["wan2.1"], EncodeConfig(vae=encoders["wan2.1"], text_encoder=encoders["text"],
                                               image_encoder=encoders["image"], frames=9, cond="first-frame",
                                               dtype="float32", progress=False))
    out["wan2.2"] = root / "wan22"
    encode(source, out["wan2.2"], EncodeConfig(vae=encoders["wan2.2"], frames=9, size=(32, 32), dtype="float32",
                                               progress=False, seed=3))
    return out


def _clip_input(source, episode: int, start: int, frames: int, size=None) -> torch.Tensor:  # noqa: F811
    """(1, 3, T, H, W) in [-1, 1], resized here independently of datakit.encode."""
    r = open_shards(source)
    u8 = np.stack([r.read_frame(episode, start + k, CAMERA) for k in range(frames)])
    x = torch.from_numpy(u8).permute(0, 3, 1, 2).float()
    if size is not None:
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    return (x / 127.5 - 1.0).permute(1, 0, 2, 3)[None]


@pytest.mark.parametrize("kind", ["wan2.1", "wan2.2"])
def test_latents_are_diffusers_posterior_mode_per_clip(features, encoders, source, kind):  # noqa: F811
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan.from_pretrained(encoders[kind]).eval()
    ds = FeatureDataset(features[kind], LoaderConfig())
    size = None if kind == "wan2.1" else (32, 32)
    assert len(ds) == 4  # one 9-frame clip per episode (13, 9, 11, 14 frames)
    for i in range(len(ds)):
        s = ds[i]
        x = _clip_input(source, int(s["episode_index"]), int(s["start"]), 9, size)
        with torch.no_grad():
            want = vae.encode(x).latent_dist.mode()[0]
            assert torch.equal(s["latents"], want)
            if kind == "wan2.1":  # I2V conditioning: [frame 0, zeros], latent frames 1..
                cond = vae.encode(torch.cat([x[:, :, :1], torch.zeros_like(x[:, :, 1:])], 2)).latent_dist.mode()
                assert torch.equal(s["cond_latents"], cond[0, :, 1:])
    # the per-clip rule: frames 5..8 encoded inside the clip (after frames 0..4) are not frames 5..8
    # encoded in a clip that starts at frame 4
    with torch.no_grad():
        sub = vae.encode(x[:, :, 4:]).latent_dist.mode()[0]
    assert sub.shape[1] == 2 and not torch.allclose(sub[:, 1], s["latents"][:, 2], atol=1e-4)
    ds.close()


def test_text_and_image_embeddings_are_the_encoders_outputs(features, encoders, source):  # noqa: F811
    from transformers import AutoTokenizer, CLIPImageProcessor, CLIPVisionModel, UMT5EncoderModel

    tok = AutoTokenizer.from_pretrained(encoders["text"])
    umt5 = UMT5EncoderModel.from_pretrained(encoders["text"]).eval()
    clip = CLIPVisionModel.from_pretrained(encoders["image"]).eval()
    proc = CLIPImageProcessor.from_pretrained(encoders["image"])
    ds = FeatureDataset(features["wan2.1"], LoaderConfig())
    tasks = ds.index.tasks
    assert [p.text for p in ds.index.prompts] == list(dict.fromkeys(tasks))  # one embedding per distinct prompt
    batch = ds.host_view(ds.read_batch(list(range(len(ds)))))
    r = open_shards(source)
    for k in range(len(ds)):
        text = tasks[int(batch["task_index"][k])]
        ids = tok(text, return_tensors="pt")["input_ids"]  # the real tokens only: no padding
        with torch.no_grad():
            want = umt5(input_ids=ids).last_hidden_state[0]
            n = int(batch["text_mask"][k].sum())
            assert n == ids.shape[1] and torch.equal(batch["text"][k, :n], want)
            assert not batch["text"][k, n:].any()
            frame0 = r.read_frame(int(batch["episode_index"][k]), int(batch["start"][k]), CAMERA)
            pix = proc(images=[frame0], return_tensors="pt")["pixel_values"]
            img = clip(pixel_values=pix, output_hidden_states=True).hidden_states[-2][0]
        assert torch.equal(batch["image"][k], img)
    # episodes 0 and 3 share task 0: one prompt id
    ep = batch["episode_index"].tolist()
    assert batch["prompt"][ep.index(0)] == batch["prompt"][ep.index(3)]
    ds.close()


def test_loader_reads_features_like_frames(features):
    """Rank split, resume and workers as for frames; state/action from the source frames."""
    root = features["wan2.2"]
    seen = []
    for rank in (0, 1):
        loader = ShardLoader(root, LoaderConfig(batch_size=1, seed=5, rank=rank, world_size=2))
        seen.append([int(b["row"][0]) for b in loader])
        loader.close()
    assert sorted(seen[0] + seen[1]) == [0, 1, 2, 3] and not set(seen[0]) & set(seen[1])
    full = ShardLoader(root, LoaderConfig(batch_size=1, seed=5))
    rows = [int(b["row"][0]) for b in full]
    again = ShardLoader(root, LoaderConfig(batch_size=1, seed=5, num_workers=1))
    it = iter(again)
    first = int(next(it)["row"][0])
    state = again.state_dict()
    resumed = ShardLoader(root, LoaderConfig(batch_size=1, seed=5))
    resumed.load_state_dict(state)
    assert [first] + [int(b["row"][0]) for b in resumed] == rows
    b = next(iter(full.device_batches("cpu", steps=1)))
    assert b["latents"].shape[1:] == (6, 3, 2, 2) and b["action"].shape[1:] == (9, 2)
    for x in (full, again, resumed):
        x.close()


def test_flipped_byte_is_caught_by_verify_and_readers(features, tmp_path):
    assert_damage_is_found(features["wan2.1"], tmp_path)  # the flipped byte lands inside the first clip's latents


def test_cli_resumes_refuses_and_says_one_line(features, encoders, source, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "f"
    args = ["encode", str(source), str(out), "--vae", str(encoders["wan2.2"]), "--clip", "5:2", "--dtype",
            "float32", "--no-progress"]
    assert main(args) == 0
    assert main(args) == 0 and "already complete" in capsys.readouterr().out
    assert main([*args[:-2], "bfloat16", "--no-progress"]) == 2  # another dtype into the same folder
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "dtype" in err
    assert main(["encode", str(source), str(tmp_path / "g"), "--vae", str(encoders["wan2.2"]), "--clip", "6"]) == 2
    assert "1 + 4k" in capsys.readouterr().err
    assert main(["encode", str(source), str(tmp_path / "g"), "--vae", str(tmp_path), "--clip", "5"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_plan_counts_the_clip_tensors(features, capsys):
    """`datakit plan` on a feature folder: bytes read per sample = the stored tensors of one clip."""
    import json

    from datakit.shards.features import load_features

    index = load_features(features["wan2.1"])
    want = sum(int(np.prod(f.shape)) * 4 for f in index.fields.values())  # float32
    assert main(["plan", str(features["wan2.1"]), "--samples-per-s", "10", "--ranks", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["features"]
    assert plan["bytes_per_sample"] == want and plan["read_bytes_per_s_per_rank"] == want * 5


def test_clip_list_is_a_pure_function_of_the_seed():
    """Starts inside the episode, distinct, non-overlapping by default (as many as fit), the same for
    the same (seed, episode) whatever else is planned, and another seed moves them."""
    from datakit.encode.clips import episode_starts

    moved = False
    for length in (9, 17, 40, 101):
        for per in (0, 3):
            s = episode_starts(length, 9, 7, 2, per)
            assert s == episode_starts(length, 9, 7, 2, per) and s == sorted(set(s))
            assert all(0 <= x <= length - 9 for x in s)
            if per == 0:
                assert len(s) == length // 9 and all(b - a >= 9 for a, b in zip(s, s[1:]))
            else:
                assert len(s) == min(3, length - 8)
            moved |= s != episode_starts(length, 9, 8, 2, per)
    assert moved and episode_starts(8, 9, 0, 0, 0) == []
