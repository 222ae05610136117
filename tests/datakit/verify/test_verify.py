"""`datakit verify` catches every damage to index.json, frames.arrow and the shards (issue 7 §6).

Each case plants one damage in a copy of a real conversion (tests/fixtures/damage.py). Most rewrite
checksums.json to match the damaged files, so the structural check itself must catch the
damage; verify must then exit 1 and name the file and the problem. The oracle for "clean" is
the untouched conversion (exit 0).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from datakit.cli import main
from datakit.verify import verify
from damage import CHECKSUMS, FRAMES, MANIFEST, copy_out, edit_column, edit_manifest, read_table
from loader_fixtures import CAMS, shards_rgb  # noqa: F401

OFF0 = "offset/" + CAMS[0]


def _verify_fails(out, capsys, *match: str) -> list[str]:
    rep = verify(out)
    assert not rep.ok
    text = "\n".join(map(str, rep.problems))
    for m in match:
        assert m in text, (m, text)
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    err = capsys.readouterr().err
    assert all(m in err for m in match)
    return [str(p) for p in rep.problems]


def test_clean_conversion_passes(shards_rgb, capsys):
    assert verify(shards_rgb).ok
    assert main(["verify", str(shards_rgb)]) == 0


# --- checksums.json ---------------------------------------------------------------------------
def test_edited_state_value_is_caught_by_the_checksum(shards_rgb, tmp_path, capsys):
    out = copy_out(shards_rgb, tmp_path / "out")
    edit_column(out, "state", lambda v: v.__setitem__(5, v[5] + 1.0), rehash_after=False)
    _verify_fails(out, capsys, f"{out / FRAMES}: sha256 differs from {CHECKSUMS}")


def test_edited_manifest_value_is_caught_by_the_checksum(shards_rgb, tmp_path, capsys):
    out = copy_out(shards_rgb, tmp_path / "out")
    edit_manifest(out, lambda d: d["stats"]["action"]["mean"].__setitem__(0, 123.0), rehash_after=False)
    _verify_fails(out, capsys, f"{out / MANIFEST}: sha256 differs from {CHECKSUMS}")


def test_missing_checksums_means_unfinished(shards_rgb, tmp_path, capsys):
    out = copy_out(shards_rgb, tmp_path / "out")
    (out / CHECKSUMS).unlink()
    _verify_fails(out, capsys, CHECKSUMS, "did not finish")


# --- frames.arrow rows against the manifest and the tars (checksums rewritten) ---------------------
def _set_at(i, value):
    return lambda v: v.__setitem__(i, value)


FRAME_DAMAGE = {
    "negative_offset": (OFF0, _set_at(3, -5), "negative offset -5"),
    "offset_past_the_end": (OFF0, _set_at(3, 10**9), "past the end"),
    "offset_shifted_one_block": (OFF0, lambda v: v.__setitem__(3, v[3] + 512), "the index says"),
    "shard_out_of_range": ("shard", _set_at(2, 57), "shard 57 is out of range"),
    "shard_swapped": ("shard", lambda v: v.__setitem__(-1, 0 if v[-1] else 1), "column 'shard'"),
    "episode_index_edited": ("episode_index", _set_at(4, 3), "column 'episode_index' row 4"),
    "frame_index_edited": ("frame_index", _set_at(6, 0), "column 'frame_index' row 6"),
    "task_index_out_of_range": ("task_index", _set_at(0, 9), "column 'task_index' row 0"),
}


@pytest.mark.parametrize("case", sorted(FRAME_DAMAGE))
def test_frames_table_damage_is_named(shards_rgb, tmp_path, capsys, case):
    out = copy_out(shards_rgb, tmp_path / "out")
    col, fn, match = FRAME_DAMAGE[case]
    edit_column(out, col, fn)
    problems = _verify_fails(out, capsys, match)
    assert not any(CHECKSUMS in p for p in problems)  # the checksums match: the row check caught it


# --- index.json ranges and shapes (checksums rewritten) --------------------------------------------
def _ep(i, **kw):
    return lambda d: d["episodes"][i].update(kw)


def _shift_shard_boundary(d):
    """Move one row from shard 0 to shard 1: ranges still tile, but episodes no longer fit."""
    d["shards"][0]["rows"][1] -= 1
    d["shards"][0]["num_frames"] -= 1
    d["shards"][1]["rows"][0] -= 1
    d["shards"][1]["num_frames"] += 1


def _widen_shard0_episodes(d):
    """Shard 0 claims the next episode too (which shard 1 holds): every episode still lies in
    its shard's range, but the range is not what the shard holds."""
    d["shards"][0]["episodes"][1] += 1


def _transpose_camera(d):
    """Height, width and frame_shape swapped together: the manifest is self-consistent, the
    .npy headers in the tar are not."""
    c = d["cameras"][CAMS[0]]
    c["height"], c["width"] = c["width"], c["height"]
    c["frame_shape"] = [c["height"], c["width"], 3]


MANIFEST_DAMAGE = {
    "row_start_shifted": (_ep(1, row_start=None), "episodes[1].row_start"),
    "episode_length_shifted": (_ep(1, length=None), "episodes"),
    "episode_shard_out_of_range": (_ep(0, shard=7), "episodes[0].shard: shard 7 is out of range"),
    "shard_rows_shifted": (_shift_shard_boundary, "lie outside shard"),
    "shard_rows_gap": (lambda d: d["shards"][1]["rows"].__setitem__(0, d["shards"][1]["rows"][0] + 1),
                       "shards[1].rows"),
    "shard_episodes_range": (lambda d: d["shards"][0].update(episodes=[90, 95]), "outside shard 0's episodes"),
    "shard_episodes_range_too_wide": (_widen_shard0_episodes, "shards[0].episodes"),
    "frame_shape_transposed": (lambda d: d["cameras"][CAMS[0]].update(frame_shape=[64, 32, 3]),
                               f"cameras['{CAMS[0]}'].frame_shape"),
    "frame_bytes_not_prod": (lambda d: d["cameras"][CAMS[0]].update(frame_bytes=64 * 32 * 3 - 1), "prod(frame_shape)"),
    "camera_transposed_consistently": (_transpose_camera, "not a uint8 array of the index's frame_shape"),
    "num_frames_total": (lambda d: d.update(num_frames=d["num_frames"] + 1), "num_frames"),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_DAMAGE))
def test_manifest_damage_is_named(shards_rgb, tmp_path, capsys, case):
    out = copy_out(shards_rgb, tmp_path / "out")
    edit, match = MANIFEST_DAMAGE[case]
    d = json.loads((out / MANIFEST).read_text())
    if case == "row_start_shifted":
        edit = _ep(1, row_start=d["episodes"][1]["row_start"] + 1)
    if case == "episode_length_shifted":
        edit = _ep(1, length=d["episodes"][1]["length"] - 1)
    edit_manifest(out, edit)
    problems = _verify_fails(out, capsys, match)
    assert not any(CHECKSUMS in p for p in problems)
    if case != "camera_transposed_consistently":
        assert any(str(out / MANIFEST) in p for p in problems)


# --- shards -----------------------------------------------------------------------------------
def test_flipped_byte_in_a_shard_is_caught(shards_rgb, tmp_path, capsys):
    out = copy_out(shards_rgb, tmp_path / "out")
    t = read_table(out)
    name = json.loads((out / MANIFEST).read_text())["shards"][0]["name"]
    off = int(t.column(OFF0)[2].as_py())
    with open(out / name, "r+b") as f:
        f.seek(off + 10)
        b = f.read(1)
        f.seek(off + 10)
        f.write(bytes([b[0] ^ 0x01]))
    _verify_fails(out, capsys, f"{out / name}: sha256 differs")


def test_truncated_shard_is_named_with_its_size(shards_rgb, tmp_path, capsys):
    out = copy_out(shards_rgb, tmp_path / "out")
    name = json.loads((out / MANIFEST).read_text())["shards"][1]["name"]
    with open(out / name, "r+b") as f:
        f.truncate(4096)
    _verify_fails(out, capsys, f"{out / name}: size 4096 differs from the index")


def test_every_row_check_agrees_with_a_brute_force_walk(shards_rgb):
    """The row checks pass on the clean fixture because each row really is what the manifest
    says: recompute it row by row with plain Python from index.json and frames.arrow."""
    d = json.loads((shards_rgb / MANIFEST).read_text())
    t = read_table(shards_rgb).to_pydict()
    for e in d["episodes"]:
        for f in range(e["length"]):
            r = e["row_start"] + f
            assert (t["episode_index"][r], t["frame_index"][r], t["shard"][r]) == (e["episode_index"], f, e["shard"])
    assert np.all(np.array(t[OFF0]) >= 0)


@pytest.mark.parametrize("col", ["state", "action"])
def test_edited_vector_value_is_caught_against_the_tar_even_with_checksums_rewritten(shards_rgb, tmp_path, capsys,
                                                                                     col):
    out = copy_out(shards_rgb, tmp_path / "out")
    dim = len(json.loads((out / MANIFEST).read_text())[f"{col}_names"])
    row = 9
    edit_column(out, col, lambda v: v.__setitem__(row * dim + 1, v[row * dim + 1] + 0.5))
    problems = _verify_fails(out, capsys, f"differs from {FRAMES} column '{col}' row {row}")
    assert not any(CHECKSUMS in p for p in problems)
