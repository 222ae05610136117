"""Raw DROID: a camera serial that is not a plain file name is refused at scan; NaN in the
trajectory is refused naming the column, episode and frame; a joint dataset of the wrong
width is refused."""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest

from datakit import source_paths
from datakit.cli import main
from datakit.errors import SourceError
from datakit.sources import scan
from datakit.synth import droid_episode_folder, make_droid_dataset


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_droid_dataset(tmp_path_factory.mktemp("d") / "raw", episode_lengths=(5, 6), height=64, width=96)


@pytest.fixture
def droid(base, tmp_path):
    return shutil.copytree(base, tmp_path / "raw")


def _meta_path(root, e):
    return sorted((root / droid_episode_folder(e)).glob("metadata_*.json"))[0]


@pytest.mark.parametrize("serial", ["../../../x", "a/b", "x\0y"], ids=repr)
def test_unsafe_serial_is_refused(droid, serial):
    path = _meta_path(droid, 1)
    meta = json.loads(path.read_text())
    meta["wrist_cam_serial"] = serial
    path.write_text(json.dumps(meta))
    with pytest.raises(SourceError) as e:
        scan(droid)
    assert str(e.value).startswith(str(path)) and "wrist_cam_serial" in str(e.value)


def _edit_h5(root, e, key, edit):
    with h5py.File(root / droid_episode_folder(e) / source_paths.DROID_TRAJECTORY, "r+") as h5:
        data = h5[key][()]
        del h5[key]
        h5.create_dataset(key, data=edit(data))


def test_nan_in_trajectory_is_refused(droid, tmp_path, capsys):
    def plant(a):
        a = a.copy()
        a[3, 2] = np.nan
        return a
    _edit_h5(droid, 1, source_paths.DROID_STATE_JOINTS, plant)
    rc = main(["convert", str(droid), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    for word in (droid_episode_folder(1), "episode 1 frame 3", "'joint_position_2'", "not finite"):
        assert word in err, (word, err)


def test_wrong_joint_width_is_refused(droid, tmp_path, capsys):
    _edit_h5(droid, 0, source_paths.DROID_ACTION_JOINTS, lambda a: a[:, :6])
    rc = main(["convert", str(droid), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "action has shape (5, 7)" in err and "declares 8" in err, err


def test_same_episode_twice_is_refused(droid):
    """A copied episode folder (same DROID uuid) would be converted, and trained on, twice."""
    src = droid / droid_episode_folder(0)
    copy = src.parent / "Fri_Jul__7_11:59:46_2023"
    shutil.copytree(src, copy)
    with pytest.raises(SourceError, match="the same episode twice"):
        scan(droid)
