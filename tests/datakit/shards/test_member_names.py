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


# --- names too long for a ustar member name (issue 14 item 19) -----------------------------------
def _ustar_accepts(name: str) -> bool:
    """Oracle: stock tarfile writes frame 0's member of camera `name` in the USTAR format the shard
    writer uses (no PAX long-name records)."""
    try:
        tarfile.TarInfo(f"{KEY}.{name}.npy").tobuf(format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="strict")
        return True
    except ValueError:
        return False


@pytest.mark.parametrize("name", ["c" * 85, "c" * 89, "c" * 90, "c" * 120, "é" * 44, "é" * 45, "é" * 44 + "c"],
                         ids=lambda n: f"{len(n.encode())}B")
def test_camera_name_rule_is_the_ustar_name_limit(name):
    from datakit.sources.checks import camera_name_problem

    problem = camera_name_problem(name)
    assert (problem is None) == _ustar_accepts(name), problem
    if problem:
        assert "100 bytes" in problem and "89" in problem, problem


def test_long_camera_name_is_refused_at_scan_and_by_doctor(base, tmp_path, capsys):
    from datakit.commands.doctor import main as doctor

    name = "observation.images." + "x" * 71  # 90 bytes: one too many
    ds = _rename_camera(base, tmp_path / "ds", name)
    with pytest.raises(SourceError) as e:
        scan(ds)
    assert str(e.value).startswith(str(ds / "meta/info.json")) and repr(name) in str(e.value), str(e.value)
    for extra in ([], ["--on-error", "skip"]):  # refused before any episode: skip cannot make it exit 0
        rc = main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress", *extra])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and "100 bytes" in err and "parquet" not in err, err
    report = tmp_path / "doctor.json"
    assert doctor([str(ds), "--no-progress", "--workers", "1", "--json", str(report)]) == 1
    findings = json.loads(report.read_text())["findings"]
    assert [f["kind"] for f in findings] == ["metadata"] and "100 bytes" in findings[0]["message"], findings


def test_longest_camera_name_converts_and_stock_tarfile_reads_it(tmp_path):
    cam = "observation.images." + "x" * 70  # 89 bytes: the longest that fits
    ds = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(2,), cameras=(cam,),
                              blank_cameras=(), height=32, width=64, codec="h264")
    assert main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"]) == 0
    with tarfile.open(sorted((tmp_path / "out").glob("*.tar"))[0]) as t:
        assert f"{KEY}.{cam}.npy" in t.getnames()
