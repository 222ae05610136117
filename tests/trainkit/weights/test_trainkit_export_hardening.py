"""`trainkit export` fails safe (issue 25, defects 7-10, the file mode and the recorded shard path).

- OUT inside the run directory (its rotation would delete it), around it, or in the dataset is
  refused in one line, before anything is written.
- OUT is written under a working name beside it and renamed when complete; an existing non-empty
  OUT is refused unless `--force`, which replaces it whole. kill -9 at named points (between the
  weights and config.json, before the marker, before the rename) leaves no OUT that looks finished
  and an old OUT byte for byte; the readers (init_from, the statistics) refuse working folders and
  incomplete markers, and still read a folder without a marker (LeRobot's, openpi's).
- A file OUT, an unwritable parent, a full disk, the run's rotation mid-export, a planted `.distcp`
  with its checksum resealed, an edited preset in the manifest: one line each, exit 2.
- A damaged newest checkpoint is named, as a resume names it, before an older one is exported.
- model.safetensors has config.json's mode; the manifest records data.shards resolved.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainkit_fixtures import cli_run, shards_rgb, step_lines  # noqa: F401 - fixtures
from trainkit_harness import TINY

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[3]
MANIFEST, DISTCP, MARKER = "trainkit.json", "__0_0.distcp", "trainkit_export.json"


@pytest.fixture(scope="module")
def run(shards_rgb, tmp_path_factory) -> Path:  # noqa: F811
    """A tiny run of 2 steps with checkpoints step-000001 and step-000002 (copy it before damaging)."""
    from trainkit.cli import main

    out = tmp_path_factory.mktemp("export_run") / "run"
    sets = ("output.progress=false", "data.num_workers=0", f"data.shards={shards_rgb}", f"output.dir={out}",
            "train.steps=2", "output.checkpoint_every=1", "parallel.fsdp=none", "parallel.ac_stride={}")
    assert main(["run", str(TINY), *[a for o in sets for a in ("--set", o)]]) == 0
    return out


def export(capsys, run_dir: Path, out: Path, *extra: str, fmt: str = "lerobot") -> tuple[int, str]:
    """`trainkit export RUN_DIR OUT --format FMT ...` in this process: (exit code, stderr stripped)."""
    from trainkit.cli import main

    code = main(["export", str(run_dir), str(out), "--format", fmt, *extra])
    return code, capsys.readouterr().err.strip()


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def working(out: Path) -> list[Path]:
    """export's working folders beside `out` (`OUT.export-PID.tmp` / `.old`)."""
    return sorted(out.parent.glob(f"{out.name}.export-*"))


def reseal(folder: Path) -> None:
    """Rewrite the manifest's file list to match the folder as it is now (the attacker's move)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                         for p in sorted(folder.iterdir()) if p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps(manifest))


# --- 7: OUT inside the run or the dataset --------------------------------------------------------

@pytest.mark.parametrize("where", ["checkpoint_folder", "run_dir", "inside_run_dir", "around_run_dir", "shards",
                                   "inside_shards"])
def test_out_inside_the_run_or_the_dataset_is_refused(run, shards_rgb, tmp_path, capsys, where):  # noqa: F811
    run_dir = shutil.copytree(run, tmp_path / "runs" / "run")
    before = tree(run_dir)
    out, what = {"checkpoint_folder": (run_dir / "checkpoints" / "step-000009", "run directory"),
                 "run_dir": (run_dir, "run directory"),
                 "inside_run_dir": (run_dir / "export", "run directory"),
                 "around_run_dir": (tmp_path / "runs", "run directory"),
                 "shards": (shards_rgb, "data.shards"),
                 "inside_shards": (shards_rgb / "export", "data.shards")}[where]
    existed = out.exists()
    code, err = export(capsys, run_dir, out, *(["--force"] if existed else []))  # --force would remove it
    line = one_line(err)
    assert code == 2 and what in line and str(out) in line, line
    after = {k: v for k, v in tree(run_dir).items() if not k.endswith(".hold")}  # the export's hold on step 2
    assert after == before and out.exists() == existed and not working(out)


# --- 8: working name + rename, --force, the marker, kill -9 ---------------------------------------

def test_an_existing_folder_is_refused_unless_force_which_replaces_it_whole(run, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "foreign.txt").write_text("someone's notes")
    code, err = export(capsys, run, out)
    line = one_line(err)
    assert code == 2 and "--force" in line and str(out) in line, line
    assert tree(out) == {"foreign.txt": b"someone's notes"}
    code, err = export(capsys, run, out, "--force")
    assert code == 0, err
    files = tree(out)
    assert "foreign.txt" not in files and {"model.safetensors", "config.json", MARKER} <= set(files), sorted(files)
    assert not working(out)
    empty = tmp_path / "empty"
    empty.mkdir()
    code, err = export(capsys, run, empty)  # an empty folder is no one's work
    assert code == 0 and (empty / MARKER).is_file(), err


KILLED = """
import os, signal, sys
from pathlib import Path
point, out = sys.argv[1], Path(sys.argv[2])
def die(): os.kill(os.getpid(), signal.SIGKILL)
import trainkit.weights.load as load, trainkit.weights.publish as publish
if point == "config":  # the weights are written, config.json not yet
    real_atomic = load.write_atomic
    def atomic(path, *a, **k):
        if Path(path).name == "config.json": die()
        return real_atomic(path, *a, **k)
    load.write_atomic = atomic
if point == "marker":  # every file written, the marker not yet complete
    real_marker = publish.write_atomic
    def marker(path, data, *a, **k):
        if Path(path).name == publish.MARKER and b'"complete": true' in data: die()
        return real_marker(path, data, *a, **k)
    publish.write_atomic = marker
if point == "rename":  # complete under its working name; with --force the old OUT already moved aside
    real_rename = os.rename
    def rename(src, dst, *a, **k):
        if Path(dst) == out: die()
        return real_rename(src, dst, *a, **k)
    os.rename = rename
from trainkit.cli import main
sys.exit(main(["export", sys.argv[3], str(out), "--format", "lerobot", *sys.argv[4:]]))
"""


@pytest.mark.parametrize("point, force", [("config", False), ("marker", False), ("rename", False),
                                          ("config", True), ("rename", True)])
def test_a_killed_export_leaves_no_out_that_looks_finished(run, tmp_path, capsys, point, force):
    from trainkit.errors import CheckpointError
    from trainkit.models import build_model, family
    from trainkit.weights.load import check_weights
    from trainkit.weights.norm_stats import read_weights_stats

    out = tmp_path / "out"
    old = None
    if force:  # an earlier export of the older checkpoint, to be replaced
        older = shutil.copytree(run, tmp_path / "older")
        shutil.rmtree(older / "checkpoints" / "step-000002")
        code, err = export(capsys, older, out)
        assert code == 0, err
        old = tree(out)
    r = subprocess.run([sys.executable, "-c", KILLED, point, str(out), str(run), *(["--force"] if force else [])],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == -9, r.stderr
    if force and point != "rename":
        assert tree(out) == old  # untouched: never new weights beside old statistics
    else:  # nothing yet, or (--force) the old one moved aside and the new one complete: neither under OUT's name
        assert not out.exists()
    left = working(out)
    assert left, "the kill came before the working folder was made"
    for folder in left:  # what a user might point init_from at
        with pytest.raises(CheckpointError, match="unfinished|superseded"):
            check_weights(build_model("pi05", "tiny"), family("pi05"), folder)
        with pytest.raises(CheckpointError, match="unfinished|superseded"):
            read_weights_stats(folder)
    code, err = export(capsys, run, out, "--force")  # a rerun finishes it and clears the leftovers
    assert code == 0 and not working(out) and (out / MARKER).is_file(), err


def test_readers_require_a_complete_marker_and_read_a_folder_without_one(run, shards_rgb, tmp_path,  # noqa: F811
                                                                         capsys):
    from trainkit.errors import CheckpointError
    from trainkit.models import build_model, family
    from trainkit.weights.load import check_weights, load_weights
    from trainkit.weights.norm_stats import read_weights_stats

    fam = family("pi05")
    out = tmp_path / "out"
    code, err = export(capsys, run, out)
    assert code == 0, err
    load_weights(build_model("pi05", "tiny"), fam, out, lambda m: None)
    read_weights_stats(out)

    incomplete = shutil.copytree(out, tmp_path / "incomplete")
    marker = json.loads((incomplete / MARKER).read_text())
    (incomplete / MARKER).write_text(json.dumps({**marker, "complete": False}))
    truncated = shutil.copytree(out, tmp_path / "truncated")
    with open(truncated / "policy_preprocessor.json", "r+b") as f:
        f.truncate(10)
    garbled = shutil.copytree(out, tmp_path / "garbled")
    (garbled / MARKER).write_text("{")
    for folder, why in ((incomplete, "incomplete"), (truncated, "policy_preprocessor.json"), (garbled, MARKER)):
        with pytest.raises(CheckpointError, match=why):
            check_weights(build_model("pi05", "tiny"), fam, folder)
        with pytest.raises(CheckpointError, match=why):
            read_weights_stats(folder)
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={tmp_path / 'ft'}",
                        f"model.init_from={incomplete}", "train.steps=1")
    line = one_line(err)
    assert code == 2 and str(incomplete) in line and "incomplete" in line, line

    foreign = shutil.copytree(out, tmp_path / "lerobot_saved")  # what LeRobot's save_pretrained leaves: no marker
    (foreign / MARKER).unlink()
    load_weights(build_model("pi05", "tiny"), fam, foreign, lambda m: None)
    read_weights_stats(foreign)


# --- 9: one line each -----------------------------------------------------------------------------

def test_out_that_is_a_file_or_under_one_is_refused(run, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out, why in ((tmp_path / "file", "is a file"), (tmp_path / "file" / "out", "which is a file")):
        code, err = export(capsys, run, out)
        line = one_line(err)
        assert code == 2 and why in line and str(out) in line, line
    assert (tmp_path / "file").read_text() == "x"


def test_a_read_only_parent_is_refused(run, tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes (test_an_unwritable_parent_is_refused "
                        "raises the error instead)")
        code, err = export(capsys, run, parent / "out")
    finally:
        parent.chmod(0o755)
    line = one_line(err)
    assert code == 2 and "Permission denied" in line and str(parent / "out") in line, line


def test_an_unwritable_parent_is_refused(run, tmp_path, capsys, monkeypatch):
    """A read-only filesystem (EROFS), raised where the working folder is made."""
    parent = tmp_path / "ro"
    parent.mkdir()
    real = os.mkdir

    def mkdir(path, *a, **k):
        if Path(path).parent == parent:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", mkdir)
    code, err = export(capsys, run, parent / "out")
    line = one_line(err)
    assert code == 2 and "Read-only file system" in line and str(parent / "out") in line, line
    assert list(parent.iterdir()) == []


@pytest.mark.parametrize("force", [False, True])
def test_a_full_disk_is_one_line_and_leaves_the_old_out(run, tmp_path, capsys, monkeypatch, force):
    import safetensors.torch

    out = tmp_path / "out"
    if force:
        code, err = export(capsys, run, out)
        assert code == 0, err
    before = tree(out) if force else None

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    code, err = export(capsys, run, out, *(["--force"] if force else []))
    line = one_line(err)
    assert code == 2 and "No space left on device" in line and str(out) in line, line
    assert (tree(out) if force else out.exists()) == (before if force else False) and not working(out)


FSIZE = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # the write fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
from trainkit.cli import main
sys.exit(main(["export", *sys.argv[1:], "--format", "lerobot"]))
"""


def test_the_safetensors_writer_failing_is_one_line(run, tmp_path):
    """The real writer (safetensors' Rust code) past a file size limit: EFBIG, as ENOSPC would come."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", FSIZE, str(run), str(out)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                       capture_output=True, text=True, timeout=120)
    line = one_line(r.stderr)
    assert r.returncode == 2 and str(out) in line and "model.safetensors" in line, line
    assert not out.exists() and not working(out)


def test_the_runs_rotation_keeps_the_checkpoint_an_export_reads(run, tmp_path, capsys, monkeypatch):
    """A save of step 3 with keep_checkpoints=1 while the export reads step 2: the rotation passes
    the held folder over (and deletes step 1); the next rotation after the export deletes it."""
    import trainkit.weights.export as export_mod
    from trainkit.checkpoint.dcp import _rotate

    run_dir = shutil.copytree(run, tmp_path / "run")
    root = run_dir / "checkpoints"
    real = export_mod.dcp.load
    seen = {}

    def load_during_a_save(*a, **k):
        shutil.copytree(root / "step-000002", root / "step-000003")
        _rotate(root, 1, 3)
        seen["after"] = sorted(p.name for p in root.iterdir() if p.is_dir())
        return real(*a, **k)

    monkeypatch.setattr(export_mod.dcp, "load", load_during_a_save)
    code, err = export(capsys, run_dir, tmp_path / "out")
    assert code == 0, err
    assert seen["after"] == ["step-000002", "step-000003"]
    _rotate(root, 1, 3)
    assert sorted(p.name for p in root.iterdir()) == ["step-000003"]  # no hold file left behind either


def test_a_checkpoint_deleted_mid_read_is_one_line(run, tmp_path, capsys, monkeypatch):
    """Where no hold can be taken (a read-only checkpoints folder), a checkpoint deleted while it
    is read is one line, not a traceback."""
    import contextlib

    import trainkit.checkpoint.dcp as dcp_mod
    import trainkit.weights.export as export_mod

    run_dir = shutil.copytree(run, tmp_path / "run")
    real = export_mod.dcp.load

    @contextlib.contextmanager
    def no_hold(folder):
        yield False

    def load_while_deleted(*a, **k):
        shutil.rmtree(run_dir / "checkpoints" / "step-000002")
        return real(*a, **k)

    monkeypatch.setattr(dcp_mod, "hold_checkpoint", no_hold)
    monkeypatch.setattr(export_mod.dcp, "load", load_while_deleted)
    code, err = export(capsys, run_dir, tmp_path / "out")
    line = one_line(err)
    assert code == 2 and "step-000002" in line, line
    assert not (tmp_path / "out").exists() and not working(tmp_path / "out")


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


@pytest.mark.parametrize("planted", ["pickle", "garbage"])
def test_a_planted_distcp_with_its_checksum_resealed_is_one_line(run, tmp_path, capsys, planted):
    run_dir = shutil.copytree(run, tmp_path / "run")
    folder = run_dir / "checkpoints" / "step-000002"
    ran = tmp_path / "RAN"
    size = (folder / DISTCP).stat().st_size
    (folder / DISTCP).write_bytes(pickle.dumps(_RunsCode(ran)) if planted == "pickle" else os.urandom(size))
    reseal(folder)
    code, err = export(capsys, run_dir, tmp_path / "out")
    assert not ran.exists(), "code from the checkpoint folder ran"
    line = one_line(err)
    assert code == 2 and str(folder) in line, line
    assert not (tmp_path / "out").exists() and not working(tmp_path / "out")


def test_a_resume_of_a_planted_distcp_with_its_checksum_resealed_is_one_line(run, shards_rgb, tmp_path,  # noqa: F811
                                                                             capsys):
    """The same plant under a resume (load_checkpoint): DCP raises a BaseException for it."""
    run_dir = shutil.copytree(run, tmp_path / "run")
    folder = run_dir / "checkpoints" / "step-000002"
    (folder / DISTCP).write_bytes(os.urandom((folder / DISTCP).stat().st_size))
    reseal(folder)
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={run_dir}", "train.steps=3",
                        "output.checkpoint_every=1", "parallel.fsdp=none", "parallel.ac_stride={}")
    line = one_line(err)
    assert code == 2 and str(folder) in line, line


@pytest.mark.parametrize("key, value", [("preset", "nope"), ("preset", "tiny_deep"), ("preset", "full"),
                                        ("family", "nope"), ("lm_depth", "four")])
def test_an_edited_manifest_model_is_one_line(run, tmp_path, capsys, key, value):
    """"full" must be refused from the checkpoint's metadata, before 3B parameters are allocated."""
    run_dir = shutil.copytree(run, tmp_path / "run")
    folder = run_dir / "checkpoints" / "step-000002"
    manifest = json.loads((folder / MANIFEST).read_text())
    if key == "lm_depth":
        manifest["config"]["model"]["overrides"] = {"lm_depth": value}
    else:
        manifest["config"]["model"][key] = value
    (folder / MANIFEST).write_text(json.dumps(manifest))
    code, err = export(capsys, run_dir, tmp_path / "out")
    line = one_line(err)
    assert code == 2 and str(folder / MANIFEST) in line, line
    assert not (tmp_path / "out").exists() and not working(tmp_path / "out")


# --- 10: a damaged newest checkpoint is named -----------------------------------------------------

def test_a_damaged_newest_checkpoint_is_named_before_the_older_is_exported(run, tmp_path, capsys):
    run_dir = shutil.copytree(run, tmp_path / "run")
    with open(run_dir / "checkpoints" / "step-000002" / DISTCP, "r+b") as f:
        f.truncate(1000)
    code, err = export(capsys, run_dir, tmp_path / "out")
    line = one_line("\n".join(x for x in err.splitlines() if not x.startswith("trainkit: note:")))  # serving notes
    assert code == 0, err
    assert line.startswith(f"trainkit: skipping checkpoint {run_dir / 'checkpoints'}/step-000002: {DISTCP}"), line
    assert line.endswith("; exporting step-000001"), line


# --- also: the file mode, the recorded shard path -------------------------------------------------

def test_the_weights_file_has_the_mode_of_its_siblings(run, tmp_path, capsys):
    code, err = export(capsys, run, tmp_path / "out")
    assert code == 0, err
    mode = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "out").iterdir()}
    assert mode["model.safetensors"] == mode["config.json"] == mode["policy_preprocessor.json"], mode


def test_the_manifest_records_data_shards_resolved(shards_rgb, tmp_path, capsys, monkeypatch):  # noqa: F811
    """A run given a relative data.shards, exported from another directory, keeps its statistics."""
    from trainkit.weights.norm_stats import read_weights_stats

    monkeypatch.chdir(shards_rgb.parent)
    run_dir = tmp_path / "run"
    code, err = cli_run(capsys, f"data.shards={shards_rgb.name}", f"output.dir={run_dir}", "train.steps=1",
                        "output.checkpoint_every=1", "parallel.fsdp=none", "parallel.ac_stride={}")
    assert code == 0, err
    manifest = json.loads((run_dir / "checkpoints" / "step-000001" / MANIFEST).read_text())
    assert manifest["config"]["data"]["shards"] == str(shards_rgb.resolve())
    monkeypatch.chdir(tmp_path)
    code, err = export(capsys, run_dir, tmp_path / "out")
    assert code == 0 and "unreadable" not in err, err
    read_weights_stats(tmp_path / "out")


def test_an_old_manifest_with_a_relative_data_shards_still_resumes(run, shards_rgb, tmp_path, capsys,  # noqa: F811
                                                                   monkeypatch):
    run_dir = shutil.copytree(run, tmp_path / "run")
    for folder in (run_dir / "checkpoints").glob("step-*[0-9]"):  # as a run before this change recorded it
        manifest = json.loads((folder / MANIFEST).read_text())
        manifest["config"]["data"]["shards"] = shards_rgb.name
        (folder / MANIFEST).write_text(json.dumps(manifest))
    monkeypatch.chdir(shards_rgb.parent)
    code, err = cli_run(capsys, f"data.shards={shards_rgb.name}", f"output.dir={run_dir}", "train.steps=3",
                        "output.checkpoint_every=1", "parallel.fsdp=none", "parallel.ac_stride={}")
    assert code == 0 and "data.shards" not in err, err
    assert [x["step"] for x in step_lines(run_dir)] == [0, 1, 2]
