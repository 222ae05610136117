"""The output-folder protocol: nothing read from OUT runs code, one OUT holds one dataset, one
conversion at a time, --force starts over, the demo never deletes a folder it did not make."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import datakit.convert.run as convert_pkg
from datakit.cli import main
from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.convert.journal import JournalInvalid, journal_from_json
from datakit.shards.index import load_frames, load_index, write_index
from datakit.shards.names import STAGING
from datakit.synth import make_lerobot_dataset
from helpers import tree_bytes

ROOT = Path(__file__).resolve().parents[3]
LENGTHS = (8, 12, 6)
CFG = dict(workers=1, shard_size=1, progress=False)  # one episode per shard


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("b") / "ds", version="v2.1", episode_lengths=LENGTHS,
                                height=64, width=96, codec="h264")


@pytest.fixture(scope="module")
def reference(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    convert(base, out, ConvertConfig(**CFG))
    return tree_bytes(out)


@pytest.fixture
def ds(base, tmp_path):
    dst = tmp_path / "ds"
    shutil.copytree(base, dst)
    return dst


def _unfinished(src: Path, out: Path, monkeypatch) -> None:
    """A conversion stopped after every shard was committed, before the index (as by kill -9)."""
    def stop(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(convert_pkg, "write_index", stop)
        with pytest.raises(KeyboardInterrupt):
            convert(src, out, ConvertConfig(**CFG))
    assert not (out / "index.json").exists()
    assert len(list((out / STAGING).glob("*.journal"))) == len(LENGTHS)


# ---- 1. nothing in OUT runs code ----------------------------------------------------------

class _Payload:
    """Unpickling this runs code: what a crafted journal did to `datakit convert`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_crafted_journals_run_nothing_and_are_redone(base, reference, tmp_path, monkeypatch):
    out = tmp_path / "out"
    _unfinished(base, out, monkeypatch)
    staging = out / STAGING
    marker = tmp_path / "PWNED"
    (staging / "shard-000000.journal").write_bytes(pickle.dumps(_Payload(marker)))
    j1 = json.loads((staging / "shard-000001.journal").read_text())
    j1["name"] = "../../evil.tar"  # a journal may not point outside its shard
    (staging / "shard-000001.journal").write_text(json.dumps(j1))
    j2 = json.loads((staging / "shard-000002.journal").read_text())
    j2["placed"][0]["state"][0][0] = "__import__('os')"  # wrong type deep inside
    (staging / "shard-000002.journal").write_text(json.dumps(j2))
    s = convert(base, out, ConvertConfig(**CFG))
    assert not marker.exists()
    assert s.resumed_shards == 0  # every crafted journal was refused, its shard redone
    assert tree_bytes(out) == reference


@pytest.fixture(scope="module")
def journal_doc(base, tmp_path_factory) -> tuple[str, list[str]]:
    from datakit.sources import scan

    out = tmp_path_factory.mktemp("j") / "out"
    with pytest.MonkeyPatch.context() as m:
        _unfinished(base, out, m)
    return (out / STAGING / "shard-000001.journal").read_text(), list(scan(base).cameras)


MUTATIONS = {
    "not_json": lambda d: "\x80\x04pickle",
    "missing_key": lambda d: {k: v for k, v in d.items() if k != "sha256"},
    "bool_for_int": lambda d: {**d, "bytes": True},
    "wrong_index": lambda d: {**d, "index": 7},
    "short_offsets": lambda d: _placed(d, lambda p: p["offsets"].update(
        {k: v[:-1] for k, v in p["offsets"].items()})),
    "offset_past_end": lambda d: _placed(d, lambda p: p["offsets"][next(iter(p["offsets"]))].__setitem__(0, 10**12)),
    "state_dim": lambda d: _placed(d, lambda p: p["state"][0].append(1.0)),
    "unknown_status": lambda d: _placed(d, lambda p: p["camera_status"].__setitem__(next(iter(p["camera_status"])), "evil")),
    "episode_not_planned": lambda d: _placed(d, lambda p: p.__setitem__("episode_index", 99)),
}


def _placed(d, change):
    change(d["placed"][0])
    return d


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_journal_schema_rejects(journal_doc, case):
    text, cams = journal_doc
    journal_from_json(text, 1, cams, 6, 6)  # the real one loads
    bad = MUTATIONS[case](json.loads(text))
    with pytest.raises(JournalInvalid):
        journal_from_json(bad if isinstance(bad, str) else json.dumps(bad), 1, cams, 6, 6)


# ---- 2. one OUT, one dataset ---------------------------------------------------------------

def _change_state(ds: Path, ep: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = ds / f"data/chunk-000/episode_{ep:06d}.parquet"
    t = pq.read_table(p)
    col = t["observation.state"].to_pylist()
    col[0] = [v + 1.0 for v in col[0]]
    t = t.set_column(t.schema.get_field_index("observation.state"), "observation.state",
                     pa.array(col, type=t.schema.field("observation.state").type))
    pq.write_table(t, p)
    return p


def _cli(capsys, src, out, *extra) -> tuple[int, str, str]:
    rc = main(["convert", str(src), str(out), "--workers", "1", "--no-progress", "--shard-size", "1", *extra])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip()


def test_resume_with_another_source_is_refused(ds, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    _unfinished(ds, out, monkeypatch)
    changed = _change_state(ds, 1)
    before = tree_bytes(out)
    rc, _, err = _cli(capsys, ds, out)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "episode 1" in err and str(changed) in err and "--force" in err
    assert tree_bytes(out) == before  # nothing kept, nothing mixed, nothing deleted
    rc, _, err = _cli(capsys, ds, out, "--force")
    assert rc == 0, err
    fresh = tmp_path / "fresh"
    convert(ds, fresh, ConvertConfig(**CFG))
    assert tree_bytes(out) == tree_bytes(fresh)


def test_finished_output_of_another_source_is_not_complete(ds, base, tmp_path, capsys):
    out = tmp_path / "out"
    assert _cli(capsys, base, out)[0] == 0
    os.utime(ds / "videos/chunk-000/observation.images.top/episode_000002.mp4", ns=(1, 1))
    rc, printed, err = _cli(capsys, ds, out)
    assert rc == 2 and "already complete" not in printed, printed
    assert "episode 2" in err and "episode_000002.mp4" in err and "modification time" in err, err


def test_copy_of_the_same_source_is_complete(base, tmp_path, capsys):
    """A copy that keeps sizes and mtimes (cp -p, rsync -t) is the same source."""
    out = tmp_path / "out"
    assert _cli(capsys, base, out)[0] == 0
    same = tmp_path / "copy"
    shutil.copytree(base, same)  # copy2: contents and mtimes
    rc, printed, err = _cli(capsys, same, out)
    assert rc == 0 and "already complete" in printed, err


def test_fingerprint_in_the_index_matches_the_files(base, tmp_path):
    """Oracle: hashlib and os.stat on the source files."""
    idx = convert(base, tmp_path / "o", ConvertConfig(**CFG)).index
    fp = idx.source["fingerprint"]
    cams = list(fp["dataset"]["cameras"])
    for ep, rows, size, sha, videos in fp["episodes"]:
        table = base / f"data/chunk-000/episode_{ep:06d}.parquet"
        assert rows == LENGTHS[ep] and size == table.stat().st_size
        assert sha == hashlib.sha256(table.read_bytes()).hexdigest()
        for cam, v in zip(cams, videos):
            st = (base / f"videos/chunk-000/{cam}/episode_{ep:06d}.mp4").stat()
            assert v == [st.st_size, st.st_mtime_ns]
    assert "decoder" not in fp and "decoder" not in idx.options  # no part of the identity


def test_resume_with_another_decoder_order_gives_the_same_bytes(base, reference, tmp_path, monkeypatch, capsys):
    """A ranking file that appears between a stopped run and its rerun changes the decoder, not
    the conversion: the rerun resumes, and the output is the unbroken run's."""
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(tmp_path / "none.json"))
    out = tmp_path / "out"
    _unfinished(base, out, monkeypatch)
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"conversion": {"h264": ["torchcodec"]}}))
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(rec))
    rc, _, err = _cli(capsys, base, out)
    assert rc == 0, err
    assert tree_bytes(out) == reference


def test_outputs_recorded_with_a_decoder_still_match(base, tmp_path, capsys):
    """Before the decoder left the identity, the index's options and fingerprint held it: such
    a finished OUT is still "already complete" (the index is rewritten as that older run did)."""
    out = tmp_path / "out"
    assert _cli(capsys, base, out)[0] == 0
    doc = json.loads((out / "index.json").read_text())
    doc["options"]["decoder"] = "auto"
    doc["source"]["fingerprint"]["decoder"] = {"requested": "auto", "order": {"*": ["pyav"]}}
    idx = load_index(out)
    idx.options, idx.source = doc["options"], doc["source"]
    write_index(out, idx, load_frames(out))
    rc, text, err = _cli(capsys, base, out)
    assert rc == 0 and "already complete" in (text + err).lower(), (text, err)


def test_force_removes_only_our_files(base, tmp_path, capsys):
    out = tmp_path / "out"
    assert _cli(capsys, base, out)[0] == 0
    (out / "notes.txt").write_text("mine")
    rc, _, err = _cli(capsys, base, out, "--force")
    assert rc == 2 and "notes.txt" in err
    assert (out / "notes.txt").read_text() == "mine" and (out / "index.json").exists()


# ---- the lock ---------------------------------------------------------------------------------

def test_second_conversion_is_refused_naming_the_holder(base, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / ".datakit.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "since": "now",
                             "command": "datakit convert A B"}).encode())
    try:
        rc, _, err = _cli(capsys, base, out)
    finally:
        os.close(fd)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"pid {os.getpid()}" in err and "datakit convert A B" in err
    assert not any(out.glob("shard-*"))
    rc, _, err = _cli(capsys, base, out)  # released: the next one runs
    assert rc == 0, err
    assert not (out / ".datakit.lock").exists()


@pytest.mark.timeout(120)
def test_two_real_conversions_into_one_out(base, tmp_path):
    """The first (stopped with SIGSTOP while it holds the lock) blocks the second; resumed, it finishes."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "datakit.cli", "convert", str(base), str(out), "--workers", "1", "--no-progress"]
    first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.time()
        while not (out / ".datakit.lock").exists() or not (out / ".datakit.lock").read_text():
            assert first.poll() is None and time.time() - t0 < 60
            time.sleep(0.01)
        first.send_signal(signal.SIGSTOP)
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2 and f"pid {first.pid}" in second.stderr, second.stderr
    finally:
        first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=60) == 0, first.stderr.read()
    assert load_index(out).num_episodes == len(LENGTHS)


# ---- demo --------------------------------------------------------------------------------------

def test_demo_refuses_a_folder_it_did_not_make(tmp_path, capsys):
    d = tmp_path / "mine"
    (d / "shards").mkdir(parents=True)
    (d / "shards" / "thesis.tex").write_text("precious")
    assert main(["demo", "--dir", str(d)]) == 2
    assert "not a folder made by `datakit demo`" in capsys.readouterr().err
    assert (d / "shards" / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in d.rglob("*")) == ["shards", "thesis.tex"]


# ---- §8: a shard whose episodes were all skipped -------------------------------------------

def test_shard_of_skipped_episodes_lists_none(ds, tmp_path, capsys):
    """It used to be listed holding the episodes it was planned for. Now the index lists only
    shards that hold episodes, and each shard named by a frame holds that frame (oracle: tarfile)."""
    import datakit

    (ds / "videos/chunk-000/observation.images.top/episode_000001.mp4").unlink()
    out = tmp_path / "out"
    rc, _, err = _cli(capsys, ds, out, "--on-error", "skip")
    assert rc == 0, err
    idx = load_index(out)
    assert [s.name for s in idx.shards] == ["shard-000000.tar", "shard-000002.tar"]
    assert not (out / "shard-000001.tar").exists()
    assert [s.episodes for s in idx.shards] == [[0, 0], [2, 2]]
    assert [s.rows for s in idx.shards] == [[0, LENGTHS[0]], [LENGTHS[0], LENGTHS[0] + LENGTHS[2]]]
    assert [e.episode_index for e in idx.episodes] == [0, 2] and idx.skipped[0]["episode_index"] == 1
    reader = datakit.open_shards(out)
    for e in idx.episodes:
        with tarfile.open(out / idx.shards[e.shard].name) as tf:
            names = tf.getnames()
        assert all(n.startswith(f"{e.episode_index:06d}/") for n in names)
        assert len(names) == e.length * 6  # 3 cameras + state + action + json per frame
        reader.read_frame(e.episode_index, e.length - 1, "observation.images.top")
    assert main(["verify", str(out)]) == 0


# ---- output errors in the commit (journal) ---------------------------------------------------

@pytest.mark.parametrize("workers", ["1", "2"])
def test_journal_write_failure_is_an_output_error(base, reference, tmp_path, monkeypatch, capsys, workers):
    """ENOSPC while journaling a shard (in the background commit, in a pool worker too): exit 2,
    one line naming OUT's file and the errno; the rerun resumes to the unbroken run's bytes."""
    import errno

    import datakit.convert.shard as shard_mod

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(shard_mod, "write_journal", full)
        rc = main(["convert", str(base), str(out), "--workers", workers, "--no-progress", "--shard-size", "1",
                   "--on-error", "skip"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert str(out) in err and "ENOSPC" in err and "shard-00000" in err, err
    assert not (out / "index.json").exists()
    rc, _, err = _cli(capsys, base, out)
    assert rc == 0, err
    assert tree_bytes(out) == reference
