"""Checkpoints a hostile or unlucky user leaves in output.dir (issue 14, items 1, 9, 10, 14).

- Planted code: a `.metadata` that runs code when unpickled, alone in a new step folder or
  wrapped around a genuine checkpoint's metadata (it runs the code and returns the real thing),
  with trainkit's manifest rewritten to match (an attacker can do that too). No marker file may
  appear and the run refuses in one line.
- Damage: a truncated, zeroed, flipped or deleted `.distcp`, a truncated or deleted `.metadata`,
  a deleted manifest, an empty newer step folder: the run says which checkpoint it skipped and
  why, and resumes from the newest intact one with the unbroken run's losses (the oracle).
- Another run's checkpoint: another dataset with the same frame count, another preset, seed,
  global batch or normalisation is refused in one line; a changed learning rate is applied from
  the resumed step on, and said so.
- Rotation: `output.keep_checkpoints` keeps the newest N.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path

import pytest

from trainkit_fixtures import base_run, cli_run, other_shards, shards_rgb, step_lines  # noqa: F401 - fixtures

pytestmark = pytest.mark.timeout(120)

MANIFEST = "trainkit.json"
DISTCP = "__0_0.distcp"


def _reseal(folder: Path) -> None:
    """Rewrite the manifest's file list to match the folder as it is now (the attacker's move)."""
    if not (folder / MANIFEST).exists():  # a trainkit without manifests (before issue 14): nothing to forge
        return
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                         for p in sorted(folder.iterdir()) if p.name != MANIFEST}
    (folder / MANIFEST).write_text(json.dumps(manifest))


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


class _RunsCodeThenGenuine:
    """Unpickles to the genuine metadata, after creating the marker file."""

    def __init__(self, marker: Path, genuine: bytes):
        self.marker, self.genuine = str(marker), genuine

    def __reduce__(self):
        return eval, (f"(open({self.marker!r}, 'w').close(), __import__('pickle').loads({self.genuine!r}))[1]",)


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("variant", ["alone_in_a_new_folder", "sealed_in_a_genuine_folder", "wrapping_genuine_metadata"])
def test_a_planted_metadata_runs_no_code(base_run, tmp_path, capsys, variant):  # noqa: F811
    marker = tmp_path / "MARKER"
    if variant == "alone_in_a_new_folder":  # the repro: output.dir/checkpoints/step-000001/.metadata
        out = tmp_path / "run"
        (out / "checkpoints" / "step-000001").mkdir(parents=True)
        (out / "checkpoints" / "step-000001" / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    else:
        out = base_run.copy(tmp_path / "run")
        folder = out / "checkpoints" / "step-000004"
        genuine = (folder / ".metadata").read_bytes()
        evil = _RunsCode(marker) if variant == "sealed_in_a_genuine_folder" else _RunsCodeThenGenuine(marker, genuine)
        (folder / ".metadata").write_bytes(pickle.dumps(evil))
        _reseal(folder)
    code, err = cli_run(capsys, *base_run.args(out))
    assert not marker.exists(), "code from the checkpoint folder ran"
    line = _one_line(err)
    assert code == 2 and "step-00000" in line, line
    if variant != "alone_in_a_new_folder":
        assert "refus" in line and ("builtins.exec" in line or "builtins.eval" in line), line


def test_a_bytes_entry_pointing_at_a_pickle_runs_no_code(base_run, tmp_path, capsys):  # noqa: F811
    """The third route: metadata made only of DCP's own classes that declares a weight a bytes
    entry, in a planted file DCP's default planner would unpickle with weights_only=False."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    marker = tmp_path / "MARKER"
    out = base_run.copy(tmp_path / "run")
    folder = out / "checkpoints" / "step-000004"
    md = pickle.loads((folder / ".metadata").read_bytes())
    fqn = next(k for k in md.state_dict_metadata if k.startswith("model."))
    evil = pickle.dumps(_RunsCode(marker))
    (folder / "__9_0.distcp").write_bytes(evil)
    md.state_dict_metadata[fqn] = BytesStorageMetadata()
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != fqn}
    md.storage_data[MetadataIndex(fqn)] = _StorageInfo(relative_path="__9_0.distcp", offset=0, length=len(evil))
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    _reseal(folder)
    code, err = cli_run(capsys, *base_run.args(out))
    assert not marker.exists(), "code from the checkpoint folder ran"
    line = _one_line(err)
    assert code == 2 and "refused" in line and "bytes entr" in line and fqn in line, line


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _zero(p: Path) -> None:
    p.write_bytes(bytes(p.stat().st_size))


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01  # inside some tensor's bytes: one weight changes in the last bits
    p.write_bytes(bytes(data))


DAMAGE = {
    "truncated_distcp": (DISTCP, _truncate),
    "zeroed_distcp": (DISTCP, _zero),
    "deleted_distcp": (DISTCP, Path.unlink),
    "truncated_metadata": (".metadata", _truncate),
    "deleted_metadata": (".metadata", Path.unlink),
    "deleted_manifest": (MANIFEST, Path.unlink),
}


def _resumed_losses(out: Path, first: int) -> dict[int, float]:
    """Losses of the resumed run: its step lines from `first` on (the resume at `first` dropped the
    stopped run's lines of those steps, so each step is there once)."""
    lines = step_lines(out)
    assert len({x["step"] for x in lines}) == len(lines), [x["step"] for x in lines]
    return {x["step"]: x["loss"] for x in lines if x["step"] >= first}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_intact_one(base_run, tmp_path, capsys, damage):  # noqa: F811
    out = base_run.copy(tmp_path / "run")
    name, harm = DAMAGE[damage]
    harm(out / "checkpoints" / "step-000004" / name)
    code, err = cli_run(capsys, *base_run.args(out))
    assert code == 0 and "Traceback" not in err, err
    skipped = [x for x in err.splitlines() if "skip" in x]
    assert len(skipped) == 1 and "step-000004" in skipped[0] and name in skipped[0], err
    assert _resumed_losses(out, 2) == {s: base_run.unbroken[s]["loss"] for s in range(2, 6)}


def test_a_flipped_byte_in_tensor_data_is_caught_by_its_checksum(base_run, tmp_path, capsys):  # noqa: F811
    out = base_run.copy(tmp_path / "run")
    _flip(out / "checkpoints" / "step-000004" / DISTCP)
    code, err = cli_run(capsys, *base_run.args(out))
    skipped = [x for x in err.splitlines() if "skip" in x]
    assert code == 0 and len(skipped) == 1 and DISTCP in skipped[0] and "sha256" in skipped[0], err
    assert _resumed_losses(out, 2) == {s: base_run.unbroken[s]["loss"] for s in range(2, 6)}


def test_an_empty_newer_step_folder_is_skipped(base_run, tmp_path, capsys):  # noqa: F811
    out = base_run.copy(tmp_path / "run")
    (out / "checkpoints" / "step-000005").mkdir()
    code, err = cli_run(capsys, *base_run.args(out))
    skipped = [x for x in err.splitlines() if "skip" in x]
    assert code == 0 and len(skipped) == 1 and "step-000005" in skipped[0] and MANIFEST in skipped[0], err
    assert _resumed_losses(out, 4) == {s: base_run.unbroken[s]["loss"] for s in range(4, 6)}


def test_no_intact_checkpoint_is_one_line(base_run, tmp_path, capsys):  # noqa: F811
    out = base_run.copy(tmp_path / "run")
    for step in ("step-000002", "step-000004"):
        _zero(out / "checkpoints" / step / DISTCP)
    code, err = cli_run(capsys, *base_run.args(out))
    line = _one_line(err)
    assert code == 2 and "no intact checkpoint" in line and "another output.dir" in line, line
    assert "step-000002" in line and "step-000004" in line, line


@pytest.mark.parametrize("override, named", [
    ("model.preset=tiny_deep", "model.preset"),
    ("train.seed=1", "train.seed"),
    ("train.micro_batch=2", "global batch"),
    ("data.norm=mean_std", "data.norm"),
    ("data.shuffle=sequential", "data.shuffle"),
])
def test_a_resume_with_other_model_data_seed_or_batch_is_one_line(base_run, tmp_path, capsys, override, named):  # noqa: F811
    out = base_run.copy(tmp_path / "run")
    code, err = cli_run(capsys, *base_run.args(out, override))
    line = _one_line(err)
    assert code == 2 and named in line and "step-000004" in line, line


def test_a_resume_against_another_dataset_of_the_same_size_is_refused(base_run, other_shards, tmp_path, capsys):  # noqa: F811
    out = base_run.copy(tmp_path / "run")
    code, err = cli_run(capsys, *base_run.args(out), f"data.shards={other_shards}")
    line = _one_line(err)
    assert code == 2 and "another dataset" in line and str(other_shards) in line, line


def test_a_moved_copy_of_the_same_dataset_resumes(base_run, tmp_path, capsys):  # noqa: F811
    """The identity is the dataset's checksums, not its path: a copy elsewhere is the same data."""
    import shutil

    data = shutil.copytree(base_run.shards, tmp_path / "moved")
    out = base_run.copy(tmp_path / "run")
    code, err = cli_run(capsys, *base_run.args(out), f"data.shards={data}")
    assert code == 0, err
    assert _resumed_losses(out, 4) == {s: base_run.unbroken[s]["loss"] for s in range(4, 6)}


def test_a_changed_learning_rate_is_applied_from_the_resumed_step_and_said(base_run, tmp_path, capsys):  # noqa: F811
    out = base_run.copy(tmp_path / "run")
    code, err = cli_run(capsys, *base_run.args(out, "optim.lr=1e-3"))
    assert code == 0, err
    said = [x for x in err.splitlines() if "optim.lr" in x]
    assert len(said) == 1 and "0.003 -> 0.001" in said[0], err
    resumed = {x["step"]: x for x in step_lines(out)[4:]}
    # the schedule's factor is unchanged (same warm-up, steps and ratio): every lr scales by 1/3
    for s in (4, 5):
        assert resumed[s]["lr"] == pytest.approx(base_run.unbroken[s]["lr"] / 3, rel=1e-12)
    # step 4's loss comes before its update (same weights as unbroken); step 5's after the new lr
    assert resumed[4]["loss"] == base_run.unbroken[4]["loss"]
    assert resumed[5]["loss"] != base_run.unbroken[5]["loss"]


@pytest.mark.parametrize("keep, left", [(None, [3, 4, 5]), ("1", [5]), ("0", [1, 2, 3, 4, 5])])
def test_keep_checkpoints_rotates_old_ones(shards_rgb, tmp_path, capsys, keep, left):  # noqa: F811
    out = tmp_path / "run"
    extra = [] if keep is None else [f"output.keep_checkpoints={keep}"]
    code, err = cli_run(capsys, f"data.shards={shards_rgb}", f"output.dir={out}", "train.steps=5",
                        "output.checkpoint_every=1", "parallel.fsdp=none", *extra)
    assert code == 0, err
    names = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert names == [f"step-{s:06d}" for s in left], names


def test_the_manifest_records_dataset_identity_and_config(base_run):  # noqa: F811
    """What the resume checks rest on: the dataset's checksums.json entries and the run's config."""
    manifest = json.loads((base_run.out / "checkpoints" / "step-000004" / MANIFEST).read_text())
    checksums = json.loads((base_run.shards / "checksums.json").read_text())
    assert manifest["dataset"]["sha256"] == checksums["sha256"]
    assert manifest["config"]["optim"]["lr"] == 3e-3 and manifest["config"]["train"]["steps"] == 4
    assert manifest["step"] == 4 and re.fullmatch(r"[0-9a-f]{64}", manifest["files"][DISTCP]["sha256"])


@pytest.mark.timeout(240)
def test_two_ranks_fall_back_together(shards_rgb, tmp_path):  # noqa: F811
    """2 gloo ranks, FSDP: the checksums are split over the ranks (rank 1 hashes the second file),
    and a file only one rank checks still makes both skip the checkpoint and resume from the
    older one, with the losses of the unbroken 2-rank run."""
    from trainkit_harness import run_distributed, tiny_config

    common = ("output.checkpoint_every=2", "output.log_every=1", "parallel.fsdp=block")
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    first = run_distributed([tiny_config(shards_rgb, unbroken, *common, "train.steps=6"),
                             tiny_config(shards_rgb, broken, *common, "train.steps=4")], world=2)
    files = sorted(p.name for p in (broken / "checkpoints" / "step-000004").iterdir() if p.name != MANIFEST)
    _flip(broken / "checkpoints" / "step-000004" / files[1])  # the file rank 1 hashes
    [resumed] = run_distributed([tiny_config(shards_rgb, broken, *common, "train.steps=6")], world=2)
    assert "error" not in resumed and resumed["start_step"] == 2, resumed
    assert resumed["losses"] == {s: first[0]["losses"][s] for s in range(2, 6)}


def test_rotation_never_deletes_the_checkpoint_just_written(base_run, tmp_path, capsys):  # noqa: F811
    """A newer folder the resume skipped (here an empty step-000009) does not count as one of the
    newest N: the run keeps its own latest checkpoint and leaves the skipped folder alone."""
    out = base_run.copy(tmp_path / "run")
    (out / "checkpoints" / "step-000009").mkdir()
    code, err = cli_run(capsys, *base_run.args(out, "output.checkpoint_every=1", "output.keep_checkpoints=1"))
    assert code == 0, err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000006", "step-000009"]
