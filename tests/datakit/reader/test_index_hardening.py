"""index.json and frames.arrow are input: every reader refuses a shard name that leaves OUT,
an unsafe camera name, a malformed manifest or an unreadable frames table, with one error
naming the file and the field (issue 7, sections 1 and 6); index.json is always strict JSON.

Damage is planted with plain json / pyarrow (tests/fixtures/damage.py) in a copy of a real conversion.
"""
from __future__ import annotations

import json
import math
import shutil

import pytest

from datakit.cli import main
from datakit.errors import DatakitError, IndexFileError
from datakit.loader import LeRobotView, LoaderConfig, ShardDataset, ShardLoader, webdataset_urls
from datakit.reader import open_shards
from datakit.shards.index import ShardIndex, load_frames, load_index, write_index
from datakit.verify import verify
from damage import CHECKSUMS, FRAMES, MANIFEST, copy_out, edit_manifest
from loader_fixtures import CAMS, shards_rgb  # noqa: F401


def _read_all_of_shard0(out):
    r = open_shards(out)
    ep = r.index.episodes[0]
    return [r.read_frame(ep.episode_index, f, CAMS[0]) for f in range(ep.length)]


READERS = {
    "ShardReader": _read_all_of_shard0,
    "ShardDataset": lambda out: ShardDataset(out, LoaderConfig(shuffle="sequential"))[0],
    "ShardLoader": lambda out: next(iter(ShardLoader(out, LoaderConfig(batch_size=4, shuffle="sequential")))),
    "LeRobotView": lambda out: LeRobotView(out)[0],
    "webdataset_urls": webdataset_urls,
    "verify": verify,
    "load_index": load_index,
}


def _refused_by_every_reader(out, *match: str) -> None:
    for name, read in READERS.items():
        with pytest.raises(IndexFileError) as err:
            read(out)
        msg = str(err.value)
        assert "\n" not in msg, name
        for m in match:
            assert m in msg, (name, msg)


def _cli_exit_2_one_line(out, capsys, *match: str) -> None:
    for cmd in ("info", "verify"):
        capsys.readouterr()
        assert main([cmd, str(out)]) == 2, cmd
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        for m in match:
            assert m in err, (cmd, err)


# --- shard names that leave OUT (section 1) -----------------------------------------------------
@pytest.mark.parametrize("kind", ["parent", "absolute", "subfolder", "not_a_shard_name"])
def test_shard_name_outside_out_is_refused_by_every_reader(shards_rgb, tmp_path, capsys, kind):
    out = copy_out(shards_rgb, tmp_path / "out")
    first = json.loads((out / MANIFEST).read_text())["shards"][0]["name"]
    # a valid copy of the shard where the name points: without the check, readers use it happily
    names = {"parent": "../outside.tar", "absolute": str(tmp_path / "abs.tar"),
             "subfolder": "sub/" + first, "not_a_shard_name": "other.tar"}
    target = {"parent": tmp_path / "outside.tar", "absolute": tmp_path / "abs.tar",
              "subfolder": out / "sub" / first, "not_a_shard_name": out / "other.tar"}[kind]
    target.parent.mkdir(exist_ok=True)
    shutil.copy(out / first, target)
    edit_manifest(out, lambda d: d["shards"][0].update(name=names[kind]))
    _refused_by_every_reader(out, str(out / MANIFEST), "shards[0].name")
    _cli_exit_2_one_line(out, capsys, "shards[0].name")


@pytest.mark.parametrize("bad", ["../evil", "a/b", ""])
def test_unsafe_camera_name_is_refused(shards_rgb, tmp_path, bad):
    out = copy_out(shards_rgb, tmp_path / "out")

    def rename(d):
        d["cameras"] = {(bad if k == CAMS[0] else k): v for k, v in d["cameras"].items()}
        for e in d["episodes"]:
            e["camera_status"][bad] = e["camera_status"].pop(CAMS[0])

    edit_manifest(out, rename)
    with pytest.raises(IndexFileError, match="unsafe camera name"):
        load_index(out)


# --- malformed index.json (section 6) -----------------------------------------------------------
def _set(path, value):
    def edit(d):
        *keys, last = path
        for k in keys:
            d = d[k]
        d[last] = value
    return edit


def _delete(path):
    def edit(d):
        *keys, last = path
        for k in keys:
            d = d[k]
        del d[last]
    return edit


MALFORMED = {
    "num_frames_string": (_set(["num_frames"], "29"), "num_frames"),
    "shards_not_a_list": (_set(["shards"], {}), "shards: expected a list"),
    "length_string": (_set(["episodes", 0, "length"], "x"), "episodes[0].length"),
    "frame_shape_string": (_set(["cameras", CAMS[0], "frame_shape"], "32x64"), "frame_shape"),
    "sha_number": (_set(["shards", 0, "sha256"], 7), "shards[0].sha256"),
    "bytes_negative": (_set(["shards", 0, "bytes"], -1), "shards[0].bytes"),
    "missing_shards": (_delete(["shards"]), "missing shards"),
    "missing_row_start": (_delete(["episodes", 0, "row_start"]), "episodes[0]: missing row_start"),
    "unknown_field": (_set(["episodes", 0, "surprise"], 1), "unknown field surprise"),
    "episode_shard_out_of_range": (_set(["episodes", 0, "shard"], 99), "episodes[0].shard"),
    "transposed_frame_shape": (_set(["cameras", CAMS[0], "frame_shape"], [64, 32, 3]), "frame_shape"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifest_names_the_file_and_field(shards_rgb, tmp_path, capsys, case):
    out = copy_out(shards_rgb, tmp_path / "out")
    edit, field = MALFORMED[case]
    edit_manifest(out, edit)
    for name in ("ShardReader", "ShardDataset", "webdataset_urls", "load_index"):
        with pytest.raises(IndexFileError) as err:
            READERS[name](out)
        assert str(out / MANIFEST) in str(err.value) and field in str(err.value), (name, str(err.value))
    capsys.readouterr()
    assert main(["info", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err


@pytest.mark.parametrize("text", ['{"format": "datakit-shards", ', "", "[1, 2]", "\xff\xfe"])
def test_manifest_that_is_not_a_json_object_names_the_file(shards_rgb, tmp_path, capsys, text):
    out = copy_out(shards_rgb, tmp_path / "out")
    (out / MANIFEST).write_bytes(text.encode("latin-1"))
    _refused_by_every_reader(out, str(out / MANIFEST))
    _cli_exit_2_one_line(out, capsys, MANIFEST)


def test_missing_manifest_names_the_file(shards_rgb, tmp_path):
    out = copy_out(shards_rgb, tmp_path / "out")
    (out / MANIFEST).unlink()
    _refused_by_every_reader(out, str(out / MANIFEST), "missing")


# --- malformed frames.arrow (section 6) ---------------------------------------------------------
FRAMES_DAMAGE = {
    "truncated": lambda b: b[: len(b) // 2],
    "garbage": lambda b: bytes(range(256)) * (len(b) // 256),
    "empty": lambda b: b"",
    "footer_cut": lambda b: b[:-10],
}


@pytest.mark.parametrize("case", sorted(FRAMES_DAMAGE))
def test_unreadable_frames_table_names_the_file(shards_rgb, tmp_path, capsys, case):
    out = copy_out(shards_rgb, tmp_path / "out")
    (out / FRAMES).write_bytes(FRAMES_DAMAGE[case]((out / FRAMES).read_bytes()))
    for name in ("ShardReader", "ShardDataset", "ShardLoader", "verify"):
        with pytest.raises(IndexFileError, match=str(out / FRAMES)):
            READERS[name](out)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 2
    assert FRAMES in capsys.readouterr().err


def test_frames_table_of_another_index_is_refused(shards_rgb, tmp_path):
    """A frames.arrow whose columns or row count are not the manifest's (e.g. one camera fewer)."""
    out = copy_out(shards_rgb, tmp_path / "out")
    edit_manifest(out, lambda d: d["episodes"].pop() and None)  # fewer rows in the manifest
    with pytest.raises(IndexFileError):  # the manifest itself no longer adds up
        load_index(out)
    out2 = copy_out(shards_rgb, tmp_path / "out2")
    import pyarrow as pa
    import pyarrow.ipc as ipc
    t = load_frames(out2)
    t = t.drop_columns(["offset/" + CAMS[1]])
    (out2 / FRAMES).unlink()
    with pa.OSFile(str(out2 / FRAMES), "wb") as sink, ipc.new_file(sink, t.schema) as w:
        w.write_table(t)
    with pytest.raises(IndexFileError, match="offset/" + CAMS[1].replace(".", r"\.")):
        open_shards(out2)


# --- strict JSON (issue 7 section 5) ------------------------------------------------------------
def test_nan_in_the_index_is_refused_when_writing_and_nothing_is_written(shards_rgb, tmp_path):
    out = copy_out(shards_rgb, tmp_path / "out")
    index, table = load_index(out), load_frames(out)
    before = {n: (out / n).read_bytes() for n in (MANIFEST, FRAMES, CHECKSUMS)}
    index.stats["state"]["mean"][1] = math.nan
    with pytest.raises(IndexFileError, match=r"stats\.state\.mean\[1\] is nan"):
        index.to_json()
    index.stats["state"]["mean"][1] = 0.0
    index.stats["action"]["max"][0] = math.inf
    with pytest.raises(DatakitError, match=r"stats\.action\.max\[0\] is inf"):
        write_index(tmp_path / "out", index, table)
    assert before == {n: (out / n).read_bytes() for n in (MANIFEST, FRAMES, CHECKSUMS)}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    with pytest.raises(DatakitError):
        write_index(fresh, index, table)
    assert list(fresh.iterdir()) == []  # not even frames.arrow: the manifest is serialised first


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_non_strict_json_tokens_are_refused_on_load(shards_rgb, tmp_path, token):
    out = copy_out(shards_rgb, tmp_path / "out")
    text = (out / MANIFEST).read_text()
    d = json.loads(text)
    old = json.dumps(d["stats"]["state"]["mean"][0])
    assert text.count(old) >= 1
    text = text.replace(old, token, 1)
    json.loads(text)  # Python's lenient parser takes it: only a strict reader refuses
    (out / MANIFEST).write_text(text)
    with pytest.raises(IndexFileError, match=f"holds {token}"):
        load_index(out)


def test_written_index_is_strict_json(shards_rgb):
    """An independent strict parser (parse_constant raising) reads what to_json writes."""
    text = load_index(shards_rgb).to_json()

    def refuse(tok):
        raise AssertionError(tok)

    assert json.loads(text, parse_constant=refuse)["format"] == "datakit-shards"
    assert ShardIndex.from_json(text).num_frames == load_index(shards_rgb).num_frames


def test_manifest_frame_shape_rule_matches_the_converter():
    """The torch-free shape rule of the manifest check is the converter's own."""
    from datakit.shards.manifest_check import stored_frame_shape
    from datakit.stages.colour import stored_shape

    for layout in ("rgb", "nv12"):
        for h, w in ((32, 64), (180, 320), (720, 1280)):
            assert stored_frame_shape(layout, h, w) == list(stored_shape(layout, h, w))


def test_task_index_out_of_range_is_refused_by_the_loader(shards_rgb, tmp_path):
    from damage import edit_column

    out = copy_out(shards_rgb, tmp_path / "out")
    edit_column(out, "task_index", lambda v: v.__setitem__(3, 40))
    with pytest.raises(IndexFileError, match="column 'task_index' row 3: 40 is not a task"):
        LeRobotView(out)
