"""A camera name becomes part of tar member names `KEY.<camera>.npy`: a name that would put a
member outside its sample is refused at scan time, naming meta/info.json and the camera.
Oracle: what stock tarfile (data filter, name round trip) and stock webdataset (sample split)
do with such a member name."""
from __future__ import annotations

import io
import json
import shutil
import tarfile

import pytest
import webdataset as wds
from webdataset.tariterators import base_plus_ext

from datakit.cli import main
from datakit.errors import SourceError
from datakit.shards.index import FRAME_KEY
from datakit.sources import scan
from datakit.synth import make_lerobot_dataset

CAM = "observation.images.top"
KEY = FRAME_KEY.format(episode=0, frame=0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("m") / "ds", version="v2.1", episode_lengths=(3, 2),
                                cameras=(CAM,), blank_cameras=(), height=64, width=96, codec="h264")


def _rename_camera(src, dst, name):
    shutil.copytree(src, dst)
    info = json.loads((dst / "meta/info.json").read_text())
    info["features"] = {(name if k == CAM else k): v for k, v in info["features"].items()}
    (dst / "meta/info.json").write_text(json.dumps(info))
    return dst


def _stock_problem(name: str) -> str | None:
    """What goes wrong with member `KEY.<name>.npy` in stock tarfile / webdataset, or None."""
    member = f"{KEY}.{name}.npy"
    info = tarfile.TarInfo(member)
    info.size = 1
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"x"))
    buf.seek(0)
    with tarfile.open(fileobj=buf) as tar:
        back = tar.getmembers()[0]
        if back.name != member:
            return f"tarfile reads the name back as {back.name!r}"
        try:
            tarfile.data_filter(back, "/tmp/x")
        except tarfile.FilterError as e:
            return f"tarfile data filter: {e}"
    key, _ = base_plus_ext(member)
    if key != KEY:
        return f"webdataset puts it in sample {key!r}"
    return None


UNSAFE = ["../evil", "a/../../b", "/etc/passwd", "a/b", "cam\0x", "cam\nx", "", "state"]


@pytest.mark.parametrize("name", UNSAFE, ids=repr)
def test_unsafe_camera_name_is_refused_at_scan(base, tmp_path, name):
    ds = _rename_camera(base, tmp_path / "ds", name)
    with pytest.raises(SourceError) as e:
        scan(ds)
    msg = str(e.value)
    assert msg.startswith(str(ds / "meta/info.json")) and repr(name) in msg and "\n" not in msg.replace(repr(name), "")


@pytest.mark.parametrize("name", ["../evil", "a/../../b", "/etc/passwd", "a/b"], ids=repr)
def test_stock_readers_misplace_those_members(name):
    """The oracle behind the refusal: these names really leave the sample with stock readers."""
    assert _stock_problem(name) is not None


def test_convert_refuses_with_one_line(base, tmp_path, capsys):
    ds = _rename_camera(base, tmp_path / "ds", "../evil")
    rc = main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "info.json" in err and "'../evil'" in err, err
    assert not (tmp_path / "out" / "index.json").exists()


def test_accepted_odd_name_stays_in_its_sample(tmp_path):
    """A name with spaces, dots and brackets is accepted, and stock webdataset reads every frame as
    one sample holding that camera."""
    cam = "observation.images.top (left)-1"
    assert _stock_problem(cam) is None
    ds = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(3,), cameras=(cam,),
                              blank_cameras=(), height=64, width=96, codec="h264")
    assert main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"]) == 0
    shard = sorted((tmp_path / "out").glob("*.tar"))[0]
    samples = list(wds.WebDataset(str(shard), shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == [FRAME_KEY.format(episode=0, frame=i) for i in range(3)]
    assert all(f"{cam}.npy" in s and "state.npy" in s for s in samples)
