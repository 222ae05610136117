"""datakit convert / verify / info / open_shards on every source format, checked against an
independent PyAV (or Pillow) decode of the source files."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

import datakit
from datakit.cli import main
from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.sources import load_episode, scan
from datakit.synth import make_droid_dataset, make_lerobot_dataset, read_frame_number
from helpers import png_decode, pyav_decode_all, tree_bytes

CAMS = ("observation.images.top", "observation.images.wrist", "observation.images.side")


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    root = tmp_path_factory.mktemp("src")
    kw = dict(episode_lengths=(9, 14, 6), height=64, width=96, tasks=("pick", "place"))
    return {
        "v2.0": make_lerobot_dataset(root / "v20", version="v2.0", codec="h264", channel_first=False,
                                     image_cameras=("observation.images.wrist",), **kw),
        "v2.1": make_lerobot_dataset(root / "v21", version="v2.1", codec="av1", **kw),
        "v3.0": make_lerobot_dataset(root / "v30", version="v3.0", codec="av1", v3_episodes_per_file=2, **kw),
        "droid": make_droid_dataset(root / "droid", episode_lengths=(7, 10), height=64, width=96, missing_ext2=True),
    }


def _source_frames(spec, ref, table, cam):
    """The oracle: the episode's frames of one camera, decoded directly from the source."""
    if cam in table.images:
        return np.stack([png_decode(b) for b in table.images[cam]])
    vs = ref.videos.get(cam)
    if vs is None:
        return None
    allf = pyav_decode_all(vs.path)
    start = int(round(vs.from_timestamp * spec.fps))
    return allf[start : start + ref.length]


@pytest.mark.parametrize("name", ["v2.0", "v2.1", "v3.0", "droid"])
def test_convert_matches_independent_decode(datasets, tmp_path, name):
    src, out = datasets[name], tmp_path / "out"
    s = convert(src, out, ConvertConfig(workers=1, shard_size=200_000, progress=False))
    spec = scan(src)
    reader = datakit.open_shards(out)
    assert s.index.num_episodes == len(spec.episodes)
    assert s.index.num_frames == sum(r.length for r in spec.episodes)
    assert s.index.num_shards >= 2  # small shard size: several shards, rolled at episode boundaries
    for ref in spec.episodes:
        table = load_episode(spec, ref)
        for cam in spec.cameras:
            want = _source_frames(spec, ref, table, cam)
            for f in range(ref.length):
                got = reader.read_frame(ref.episode_index, f, cam)
                assert got.dtype == np.uint8 and got.shape == (spec.cameras[cam].height, spec.cameras[cam].width, 3)
                if want is None:
                    assert not got.any()
                else:
                    np.testing.assert_array_equal(got, want[f], err_msg=f"{name} ep{ref.episode_index} f{f} {cam}")
        rows = slice(reader.row(ref.episode_index, 0), reader.row(ref.episode_index, ref.length - 1) + 1)
        state = np.stack(reader.frames.column("state").to_pylist()[rows])
        np.testing.assert_allclose(state, table.state, rtol=0, atol=0)
    assert datakit.cli.main(["verify", str(out)]) == 0


def test_slot_detection(datasets, tmp_path):
    idx = convert(datasets["v2.1"], tmp_path / "a", ConvertConfig(workers=1, progress=False)).index
    assert {c: e.status for c, e in idx.cameras.items()} == {CAMS[0]: "real", CAMS[1]: "real", CAMS[2]: "blank"}
    assert all(e.camera_status[CAMS[2]] == "blank" for e in idx.episodes)
    idx = convert(datasets["droid"], tmp_path / "d", ConvertConfig(workers=1, progress=False)).index
    ext2 = "observation.images.exterior_2_left"
    assert idx.cameras[ext2].status == "real"
    assert [e.camera_status[ext2] for e in idx.episodes] == ["real", "missing"]
    assert idx.cameras[ext2].episodes == {"real": 1, "blank": 0, "missing": 1}


def test_resize_matches_pillow(datasets, tmp_path):
    src, out = datasets["v2.1"], tmp_path / "r"
    convert(src, out, ConvertConfig(workers=1, resize="32x40", progress=False))
    spec = scan(src)
    ref = spec.episodes[1]
    want = pyav_decode_all(ref.videos[CAMS[0]].path)
    reader = datakit.open_shards(out)
    for f in (0, 5, 13):
        got = reader.read_frame(1, f, CAMS[0])
        pil = np.asarray(Image.fromarray(want[f]).resize((40, 32), Image.Resampling.BILINEAR))
        assert got.shape == (32, 40, 3)
        assert np.abs(got.astype(int) - pil.astype(int)).max() <= 2  # torch's antialias kernel is PIL's


def test_nv12_layout_reads_back_as_rgb(datasets, tmp_path):
    src, out = datasets["v2.1"], tmp_path / "n"
    s = convert(src, out, ConvertConfig(workers=1, layout="nv12", progress=False))
    assert s.index.cameras[CAMS[0]].frame_shape == [96, 96]
    rgb_bytes = 64 * 96 * 3
    assert s.index.cameras[CAMS[0]].frame_bytes * 2 == rgb_bytes
    spec = scan(src)
    want = pyav_decode_all(spec.episodes[0].videos[CAMS[0]].path)
    reader = datakit.open_shards(out)
    for f in range(spec.episodes[0].length):
        got = reader.read_frame(0, f, CAMS[0])
        err = np.abs(got.astype(int) - want[f].astype(int))
        assert err.mean() < 4, err.mean()  # chroma subsampling only
        assert read_frame_number(got) == read_frame_number(want[f]) != -1


def test_deterministic_across_workers(datasets, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    convert(datasets["v3.0"], a, ConvertConfig(workers=1, shard_size=150_000, progress=False))
    convert(datasets["v3.0"], b, ConvertConfig(workers=2, shard_size=150_000, progress=False))
    assert tree_bytes(a) == tree_bytes(b)


def test_rerun_of_finished_output_is_a_noop(datasets, tmp_path):
    out = tmp_path / "o"
    convert(datasets["v2.1"], out, ConvertConfig(workers=1, progress=False))
    before = tree_bytes(out)
    s = convert(datasets["v2.1"], out, ConvertConfig(workers=1, progress=False))
    assert s.already_complete and tree_bytes(out) == before


def test_info_json_and_verify_flipped_byte(datasets, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["convert", str(datasets["v2.1"]), str(out), "--workers", "1", "--no-progress",
                 "--shard-size", "200KiB"]) == 0
    capsys.readouterr()
    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["num_episodes"] == 3 and info["num_frames"] == 29 and info["num_shards"] >= 2
    assert info["cameras"][CAMS[2]] == {"height": 64, "width": 96, "status": "blank",
                                        "episodes": {"real": 0, "blank": 3, "missing": 0}}
    assert main(["verify", str(out)]) == 0
    shard = out / "shard-000001.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    assert "shard-000001.tar" in capsys.readouterr().err


def test_verify_catches_wrong_offset(datasets, tmp_path):
    """A shard with the right hash but an index pointing at the wrong place is also caught."""
    import pyarrow as pa

    from datakit.shards.index import load_frames, write_frames
    from datakit.shards.names import FRAMES_NAME
    from datakit.verify import verify

    out = tmp_path / "o"
    convert(datasets["v2.1"], out, ConvertConfig(workers=1, progress=False))
    t = load_frames(out)
    col = "offset/" + CAMS[0]
    offs = t.column(col).to_numpy().copy()
    offs[3] += 512
    t = t.set_column(t.schema.get_field_index(col), col, pa.array(offs))
    write_frames(out / FRAMES_NAME, t)
    rep = verify(out)
    assert not rep.ok and "shard-000000.tar" in str(rep.problems[0])


def test_webdataset_and_tar_read_shards(datasets, tmp_path):
    import tarfile

    import webdataset as wds

    out = tmp_path / "o"
    convert(datasets["v2.1"], out, ConvertConfig(workers=1, progress=False))
    shard = str(out / "shard-000000.tar")
    with tarfile.open(shard) as tf:
        names = tf.getnames()
    assert names[0] == "000000/000000.observation.images.top.npy"
    reader = datakit.open_shards(out)
    samples = list(wds.WebDataset(shard, shardshuffle=False).decode())
    assert len(samples) == 29
    s = samples[10]
    ep, fr = s["json"]["episode_index"], s["json"]["frame_index"]
    np.testing.assert_array_equal(s["observation.images.top.npy"], reader.read_frame(ep, fr, CAMS[0]))
    assert s["state.npy"].dtype == np.float32 and s["state.npy"].shape == (6,)


def test_shard_plan_predicts_the_written_bytes(datasets, tmp_path):
    """The plan (made from metadata alone) predicts each episode's bytes exactly, and shards
    end after the episode that reaches --shard-size."""
    from datakit.convert.plan import plan_shards, predicted_bytes

    src = datasets["droid"]  # one camera missing in one episode
    cfg = ConvertConfig(workers=1, shard_size=150_000, progress=False)
    idx = convert(src, tmp_path / "o", cfg).index
    spec = scan(src)
    plan = plan_shards(spec, cfg)
    assert [[r.episode_index for r in p] for p in plan] == [[e.episode_index for e in idx.episodes if e.shard == i]
                                                          for i in range(idx.num_shards)]
    for i, refs in enumerate(plan):
        assert idx.shards[i].bytes == sum(predicted_bytes(spec, cfg, r) for r in refs) + 1024


def test_normalisation_stats_match_numpy_on_the_source(datasets, tmp_path):
    idx = convert(datasets["v2.1"], tmp_path / "o", ConvertConfig(workers=1, progress=False)).index
    spec = scan(datasets["v2.1"])
    tables = [load_episode(spec, r) for r in spec.episodes]
    for key in ("state", "action"):
        x = np.concatenate([getattr(t, key) for t in tables]).astype(np.float64)
        want = {"mean": x.mean(0), "std": x.std(0), "min": x.min(0), "max": x.max(0),
                "q01": np.percentile(x, 1, axis=0), "q99": np.percentile(x, 99, axis=0)}
        for stat, v in want.items():
            np.testing.assert_allclose(idx.stats[key][stat], v, rtol=1e-6, atol=1e-6, err_msg=f"{key} {stat}")


def test_toml_config_with_cli_override(datasets, tmp_path, capsys):
    cfg = tmp_path / "convert.toml"
    cfg.write_text('[convert]\nresize = "32x48"\nlayout = "nv12"\nworkers = 1\nshard_size = 100000\n')
    out = tmp_path / "o"
    assert main(["convert", str(datasets["v2.1"]), str(out), "--config", str(cfg), "--layout", "rgb",
                 "--no-progress"]) == 0
    idx = datakit.open_shards(out).index
    assert idx.options["resize"] == "32x48" and idx.options["shard_size"] == 100000  # from the file
    assert idx.layout == "rgb" and idx.cameras[CAMS[0]].frame_shape == [32, 48, 3]  # the flag wins
    bad = tmp_path / "bad.toml"
    bad.write_text('[convert]\nresise = "32x48"\n')
    capsys.readouterr()
    assert main(["convert", str(datasets["v2.1"]), str(tmp_path / "o2"), "--config", str(bad)]) == 2
    assert "unknown keys ['resise']" in capsys.readouterr().err


def test_bad_options_are_config_errors_naming_the_option(tmp_path):
    """Each refused value names its option (a typed ConfigError, exit 2 from the CLI); the old
    TOML key `prefetch` is refused with its new name, and the old flag still parses."""
    import argparse

    from datakit.cli import add_convert
    from datakit.errors import ConfigError

    for kw, option in ((dict(layout="bgr"), "layout"), (dict(workers=0), "workers"),
                       (dict(resize="33x48", layout="nv12"), "resize"), (dict(resize="big"), "resize"),
                       (dict(ray_cpus_per_task=0), "ray_cpus_per_task"), (dict(decoder_threads=-1), "decoder_threads")):
        with pytest.raises(ConfigError) as e:
            ConvertConfig(**kw)
        assert e.value.option == option, (kw, str(e.value))
    old = tmp_path / "old.toml"
    old.write_text("[convert]\nprefetch = false\n")
    with pytest.raises(ConfigError, match="prefetch is now camera_threads"):
        ConvertConfig.from_toml(old)
    parser = argparse.ArgumentParser()
    add_convert(parser.add_subparsers(dest="command"))
    for flag, want in (("--prefetch", True), ("--no-prefetch", False), ("--camera-threads", True),
                       ("--no-camera-threads", False), (None, None)):
        assert parser.parse_args(["convert", "s", "o", *([flag] if flag else [])]).camera_threads is want
