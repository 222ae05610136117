"""`datakit convert` meets an OUT that is not what it left: a finished OUT damaged since (edited
index, deleted or truncated shard; local and s3://) is refused naming the damage, never called
"already complete"; an OUT made read-only mid-run gives one line with any --workers; a run that
skips every episode is an error, not an empty OUT; an unreadable (deeply nested) journal is redone."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import datakit.convert.run as convert_run
from datakit.cli import main
from datakit.convert import convert
from datakit.convert.config import ConvertConfig
from datakit.shards.names import STAGING
from datakit.synth import make_lerobot_dataset
from helpers import tree_bytes

ROOT = Path(__file__).resolve().parents[3]
LENGTHS = (6, 8, 5, 7)
CFG = dict(workers=1, shard_size=1, progress=False)  # one episode per shard
FLAGS = ["--workers", "1", "--shard-size", "1", "--no-progress"]
DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON that json.loads cannot parse without a RecursionError


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_lerobot_dataset(tmp_path_factory.mktemp("d") / "ds", version="v2.1", episode_lengths=LENGTHS,
                                height=32, width=64, codec="h264", cameras=("observation.images.top",),
                                blank_cameras=())


@pytest.fixture(scope="module")
def finished(base, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("f") / "out"
    convert(base, out, ConvertConfig(**CFG))
    return out


@pytest.fixture
def out(finished, tmp_path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "out"))


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main(list(map(str, args)))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err.strip()


def _one_line(rc: int, err: str) -> str:
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (rc, err)
    return err


# ---- 16. "already complete" only for an OUT that still matches its checksums and sizes -----------

def _edit_index(out: Path) -> None:
    d = json.loads((out / "index.json").read_text())
    d["fps"] = 11.0  # still a well-formed index: only checksums.json tells
    (out / "index.json").write_text(json.dumps(d, indent=1))


def _flip_frames(out: Path) -> None:
    data = bytearray((out / "frames.arrow").read_bytes())
    data[len(data) // 2] ^= 1
    (out / "frames.arrow").write_bytes(bytes(data))


def _edit_checksum(out: Path, name: str) -> None:
    d = json.loads((out / "checksums.json").read_text())
    d["sha256"][name] = "0" * 64
    (out / "checksums.json").write_text(json.dumps(d))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 512)


DAMAGE = {
    "index_edited": (_edit_index, "index.json", "checksums.json"),
    "frames_edited": (_flip_frames, "frames.arrow", "checksums.json"),
    "checksums_edited": (lambda o: _edit_checksum(o, "index.json"), "index.json", "checksums.json"),
    "shard_deleted": (lambda o: (o / "shard-000001.tar").unlink(), "shard-000001.tar", "missing"),
    "shard_truncated": (lambda o: _truncate(o / "shard-000002.tar"), "shard-000002.tar", "size"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_damaged_finished_output_is_not_complete(base, out, capsys, case):
    damage, name, word = DAMAGE[case]
    damage(out)
    before = tree_bytes(out)
    rc, printed, err = _cli(capsys, "convert", base, out, *FLAGS)
    line = _one_line(rc, err)
    assert "already complete" not in printed, printed
    assert str(out / name) in line and word in line and "--force" in line, line
    assert tree_bytes(out) == before  # refused: nothing in OUT was touched


def test_damaged_finished_output_is_converted_again_with_force(base, finished, out, capsys):
    (out / "shard-000001.tar").unlink()
    rc, printed, err = _cli(capsys, "convert", base, out, *FLAGS, "--force")
    assert rc == 0 and "already complete" not in printed, err
    assert tree_bytes(out) == tree_bytes(finished)


def test_intact_finished_output_is_still_complete(base, out, capsys):
    rc, printed, err = _cli(capsys, "convert", base, out, *FLAGS)
    assert rc == 0 and "already complete" in printed and "checksums.json" in printed, (printed, err)


@pytest.fixture
def remote_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("DATAKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["index_edited", "shard_deleted"])
def test_damaged_finished_remote_output_is_not_complete(base, bucket, remote_cache, capsys, case):
    import s3fs

    url = f"{bucket}/out"
    assert _cli(capsys, "convert", base, url, *FLAGS)[0] == 0
    fs = s3fs.S3FileSystem()
    key = url[len("s3://"):]
    if case == "index_edited":
        d = json.loads(fs.cat_file(f"{key}/index.json"))
        d["fps"] = 11.0
        fs.pipe_file(f"{key}/index.json", json.dumps(d).encode())
        name, word = "index.json", "checksums.json"
    else:
        fs.rm_file(f"{key}/shard-000001.tar")
        name, word = "shard-000001.tar", "missing"
    fs.invalidate_cache()
    rc, printed, err = _cli(capsys, "convert", base, url, *FLAGS)
    line = _one_line(rc, err)
    assert "already complete" not in printed
    assert f"{url}/{name}" in line and word in line and "datakit-index-" not in line, line


# ---- 17. OUT made read-only mid-run: one line, with one worker or a pool -------------------------

# Makes OUT immutable (chattr +i: read-only even for root) as the third shard starts, in whichever
# process converts it (pool workers are forked with this patch in place).
IMMUTABLE_MID_RUN = """
import subprocess, sys
import datakit.convert.engines.local as local
from datakit.cli import main
src, out, workers = sys.argv[1:4]
real = local.write_shard
def write_shard(spec, cfg, o, index, refs, progress):
    if index == 2:
        subprocess.run(["chattr", "+i", out], check=True)
    return real(spec, cfg, o, index, refs, progress)
local.write_shard = write_shard
try:
    rc = main(["convert", src, out, "--workers", workers, "--shard-size", "1", "--no-progress"])
finally:
    subprocess.run(["chattr", "-i", out])
sys.exit(rc)
"""


def _can_make_immutable(folder: Path) -> bool:
    probe = folder / "probe"
    probe.mkdir()
    try:
        if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode:
            return False
        try:
            (probe / "x").touch()
            return False  # chattr did not take (not root, or a filesystem without the flag)
        except OSError:
            return True
    except FileNotFoundError:
        return False
    finally:
        subprocess.run(["chattr", "-i", str(probe)], capture_output=True)
        shutil.rmtree(probe, ignore_errors=True)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [1, 2])
def test_output_made_read_only_mid_run_is_one_line(base, tmp_path, workers):
    if shutil.which("chattr") is None or not _can_make_immutable(tmp_path):
        pytest.skip("chattr +i is not available here")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", IMMUTABLE_MID_RUN, str(base), str(out), str(workers)],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=150)
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(out) in err and "EPERM" in err, err
    assert not (out / "checksums.json").exists()
    rc = subprocess.run([sys.executable, "-m", "datakit.cli", "convert", str(base), str(out), *FLAGS],
                        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=150)
    assert rc.returncode == 0, rc.stderr  # writable again: the rerun resumes and finishes


# ---- 18. every episode skipped: an error, not an empty OUT ---------------------------------------

def test_every_episode_skipped_is_an_error(base, tmp_path, capsys):
    ds = Path(shutil.copytree(base, tmp_path / "ds"))
    for p in (ds / "data").rglob("*.parquet"):
        p.write_bytes(b"not parquet")
    out = tmp_path / "out"
    rc, printed, err = _cli(capsys, "convert", ds, out, *FLAGS, "--on-error", "skip")
    line = _one_line(rc, err)
    assert str(ds) in line and f"all {len(LENGTHS)} episodes" in line and "episode_000000.parquet" in line, line
    assert not (out / "checksums.json").exists() and not (out / "index.json").exists()
    assert _cli(capsys, "verify", out)[0] == 2  # not a finished conversion
    rc, _, err = _cli(capsys, "convert", ds, out, *FLAGS, "--on-error", "skip")  # a rerun says the same
    assert _one_line(rc, err) == line


def test_some_episodes_skipped_still_converts(base, tmp_path, capsys):
    ds = Path(shutil.copytree(base, tmp_path / "ds"))
    (ds / "data/chunk-000/episode_000001.parquet").write_bytes(b"not parquet")
    rc, _, err = _cli(capsys, "convert", ds, tmp_path / "out", *FLAGS, "--on-error", "skip")
    assert rc == 0, err
    assert _cli(capsys, "verify", tmp_path / "out")[0] == 0


def test_verify_refuses_a_finished_output_without_episodes(out, capsys):
    """What an earlier datakit wrote when every episode was skipped: a consistent index of nothing."""
    import hashlib

    import pyarrow as pa

    from datakit.shards.index import frames_schema, load_index, write_frames

    index = load_index(out)
    d = json.loads((out / "index.json").read_text())
    d["skipped"] = [{"episode_index": e.episode_index, "source": "x", "reason": "bad"} for e in index.episodes]
    d.update(shards=[], episodes=[], num_episodes=0, num_frames=0, num_shards=0)
    for cam in d["cameras"].values():
        cam["episodes"] = {"real": 0, "blank": 0, "missing": 0}
    (out / "index.json").write_text(json.dumps(d, indent=1))
    for p in out.glob("shard-*.tar"):
        p.unlink()
    write_frames(out / "frames.arrow", frames_schema(list(index.cameras), len(index.state_names),
                                                     len(index.action_names)).empty_table())
    sums = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in ("index.json", "frames.arrow")}
    (out / "checksums.json").write_text(json.dumps({"sha256": sums}))
    rc, _, err = _cli(capsys, "verify", out)
    assert rc == 1 and str(out / "index.json") in err and "no episode" in err, err


# ---- 20. a journal that cannot be parsed (nested too deep) is redone, not fatal -----------------

def test_deeply_nested_journal_is_redone(base, finished, tmp_path, monkeypatch):
    out = tmp_path / "out"

    def stop(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # every shard committed and journaled, no index (as by kill -9)
        m.setattr(convert_run, "write_index", stop)
        with pytest.raises(KeyboardInterrupt):
            convert(base, out, ConvertConfig(**CFG))
    (out / STAGING / "shard-000001.journal").write_text(DEEP)
    s = convert(base, out, ConvertConfig(**CFG))
    assert s.resumed_shards == len(LENGTHS) - 1  # the unreadable journal's shard was converted again
    assert tree_bytes(out) == tree_bytes(finished)
