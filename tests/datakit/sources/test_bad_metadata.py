"""Malformed LeRobot metadata gets one SourceError line naming the file, never a traceback:
info.json not an object, wrong types, unknown template fields, bad episode lengths, and a
seeded fuzz of info.json / episodes.jsonl values."""
from __future__ import annotations

import json
import random
import shutil

import pytest

from datakit.cli import main
from datakit.errors import SourceError
from datakit.sources import scan
from datakit.synth import make_lerobot_dataset

CAM = "observation.images.top"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("md") / "ds", version="v2.1", episode_lengths=(3, 2),
                                cameras=(CAM,), blank_cameras=(), height=64, width=96, codec="h264")


@pytest.fixture(scope="module")
def base_v3(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("md3") / "ds", version="v3.0", episode_lengths=(3, 2),
                                cameras=(CAM,), blank_cameras=(), height=64, width=96, codec="h264")


@pytest.fixture
def ds(base, tmp_path):
    return shutil.copytree(base, tmp_path / "ds")


def _edit_info(ds, edit):
    path = ds / "meta/info.json"
    info = json.loads(path.read_text())
    info = edit(info)
    path.write_text(json.dumps(info))


def _put(info, keys, value):
    d = info
    for k in keys[:-1]:
        d = d[k]
    d[keys[-1]] = value
    return info


INFO_CASES = {
    "list_not_object": (lambda i: [i], "not a json object"),
    "fps_string": (lambda i: _put(i, ["fps"], "30"), "invalid fps"),
    "fps_zero": (lambda i: _put(i, ["fps"], 0), "invalid fps"),
    "features_list": (lambda i: _put(i, ["features"], list(i["features"])), "features is not a json object"),
    "feature_not_object": (lambda i: _put(i, ["features", CAM], "video"), "features is not a json object"),
    "shape_not_list": (lambda i: _put(i, ["features", CAM, "shape"], "3x64x96"), "not a list of positive integers"),
    "state_shape_negative": (lambda i: _put(i, ["features", "observation.state", "shape"], [-6]),
                             "not a list of positive integers"),
    "unknown_data_path_field": (lambda i: _put(i, ["data_path"], "data/{episode_chunk}/{episode_idx}.parquet"),
                                "data_path template"),
    "bad_data_path_format": (lambda i: _put(i, ["data_path"], "data/{episode_index:q}.parquet"), "data_path template"),
    "data_path_not_string": (lambda i: _put(i, ["data_path"], 7), "data_path 7 is not a string"),
    "data_path_outside": (lambda i: _put(i, ["data_path"], "../x/{episode_index}.parquet"), "outside the dataset"),
    "video_path_attribute": (lambda i: _put(i, ["video_path"], "{video_key.upper}/{episode_index}.mp4"),
                             "video_path template"),
    "chunks_size_string": (lambda i: _put(i, ["chunks_size"], "1000"), "invalid chunks_size"),
}


@pytest.mark.parametrize("case", sorted(INFO_CASES))
def test_malformed_info_is_one_line(ds, tmp_path, capsys, case):
    edit, words = INFO_CASES[case]
    _edit_info(ds, edit)
    with pytest.raises(SourceError) as e:
        scan(ds)
    assert str(e.value).startswith(str(ds / "meta/info.json")) and words in str(e.value), str(e.value)
    rc = main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "info.json" in err, err


EPISODE_CASES = {
    "length_missing": (lambda r: {k: v for k, v in r.items() if k != "length"}, "missing length"),
    "length_null": (lambda r: {**r, "length": None}, "invalid length None"),
    "length_string": (lambda r: {**r, "length": "three"}, "invalid length 'three'"),
    "length_fraction": (lambda r: {**r, "length": 2.5}, "invalid length 2.5"),
    "episode_index_bool": (lambda r: {**r, "episode_index": True}, "invalid episode_index True"),
    "row_not_object": (lambda r: [r], "line 2 is not a json object"),
}


@pytest.mark.parametrize("case", sorted(EPISODE_CASES))
def test_malformed_episode_rows(ds, case):
    edit, words = EPISODE_CASES[case]
    path = ds / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1] = edit(rows[1])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SourceError) as e:
        scan(ds)
    assert str(e.value).startswith(str(path)) and words in str(e.value), str(e.value)


def test_v3_null_length(base_v3, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ds = shutil.copytree(base_v3, tmp_path / "ds")
    path = ds / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    rows[1]["length"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
    with pytest.raises(SourceError, match=r"file-000.parquet: row 1 \(episode 1\): invalid length None"):
        scan(ds)


def _mutations(value, rng):
    return rng.choice([None, -1, 0, 1.5, "x", "", [], {}, [1, "a"], {"a": None}, True, 1e308, [value]])


@pytest.mark.parametrize("seed", range(3))
def test_fuzzed_metadata_never_raises_anything_but_source_error(base, tmp_path, seed):
    """Replace random values of info.json and episodes.jsonl by values of other types: scan
    either succeeds or raises SourceError (one line, naming a file of the dataset)."""
    rng = random.Random(seed)
    for trial in range(25):
        ds = shutil.copytree(base, tmp_path / f"ds{trial}")
        info = json.loads((ds / "meta/info.json").read_text())
        paths = []

        def walk(d, prefix):
            for k, v in (d.items() if isinstance(d, dict) else enumerate(d)):
                paths.append(prefix + [k])
                if isinstance(v, (dict, list)):
                    walk(v, prefix + [k])
        walk(info, [])
        for keys in rng.sample(paths, 3):
            try:
                cur = info
                for k in keys[:-1]:
                    cur = cur[k]
                cur[keys[-1]] = _mutations(cur[keys[-1]], rng)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier mutation removed the parent
        (ds / "meta/info.json").write_text(json.dumps(info))
        if rng.random() < 0.5:
            ep = ds / "meta/episodes.jsonl"
            rows = [json.loads(line) for line in ep.read_text().splitlines()]
            key = rng.choice(["episode_index", "length", "tasks"])
            rows[rng.randrange(len(rows))][key] = _mutations(0, rng)
            ep.write_text("".join(json.dumps(r) + "\n" for r in rows))
        try:
            scan(ds)
        except SourceError as e:
            assert "\n" not in str(e) and str(e).startswith(str(ds)), str(e)
        shutil.rmtree(ds)


@pytest.mark.timeout(20)
def test_huge_episode_index_is_a_gap_not_a_memory_blowup(ds):
    path = ds / "meta/episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["episode_index"] = 10**18
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SourceError, match=r"info.json: episode_index has gaps: 999999999999999999 missing \(1, 2, 3, 4, 5, \.\.\.\)"):
        scan(ds)


# ---- issue 14: JSON nested too deeply (item 20), a garbage line named by its number (item 22) ----
DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON that json.loads cannot parse without a RecursionError


def test_deeply_nested_info_json_is_one_line(ds, tmp_path, capsys):
    from datakit.commands.doctor import main as doctor

    info = ds / "meta/info.json"
    info.write_text(info.read_text().rstrip()[:-1] + ', "deep": ' + DEEP + "}")
    with pytest.raises(SourceError) as e:
        scan(ds)
    assert str(e.value).startswith(str(info)) and "nested" in str(e.value), str(e.value)
    rc = main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "info.json" in err, err
    report = tmp_path / "doctor.json"
    assert doctor([str(ds), "--no-progress", "--workers", "1", "--json", str(report)]) == 1  # one finding
    findings = json.loads(report.read_text())["findings"]
    assert [(f["kind"], f["path"]) for f in findings] == [("metadata", str(info))], findings


GARBAGE_LINES = {
    "not_json": b'{"episode_index": 1, garbage',
    "not_utf8": b'{"episode_index": 1, "tasks": ["\xff\xfe"]}',
    "nested_too_deep": DEEP.encode(),
}


@pytest.mark.parametrize("case", sorted(GARBAGE_LINES))
def test_garbage_episodes_line_is_named_by_its_number(ds, tmp_path, capsys, case):
    path = ds / "meta/episodes.jsonl"
    lines = path.read_bytes().splitlines()
    lines[1:2] = [b"", GARBAGE_LINES[case]]  # a blank line counts: the number is the one an editor shows
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(SourceError) as e:
        scan(ds)
    msg = str(e.value)
    assert msg.startswith(str(path)) and "line 3" in msg and "line 1 " not in msg, msg
    rc = main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "line 3" in err, err
