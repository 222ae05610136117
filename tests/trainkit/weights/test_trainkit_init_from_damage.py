"""Damaged `model.init_from` checkpoints and statistics (issue 25, defects 1-6): each is refused
in one line naming the file (and the tensor or key) and what is wrong, exit 2, before step 0.

The checkpoints are trainkit's own exports of a tiny random model (test_trainkit_init_from.py's
`export`), damaged byte by byte: the safetensors header is rewritten with plain `struct` + `json`,
not through safetensors, so the damage is what a disk, a copy or a hand gives, not what a writer
allows. Pickles named `.safetensors` carry a payload that creates a marker folder when unpickled:
the marker never appears (nothing from the file ran).
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from damage import copy_out, edit_manifest
from test_trainkit_init_from import GATE, LM_Q, export, random_tiny
from trainkit_fixtures import cli_run, shards_rgb  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)
STATE_FILE = "policy_preprocessor_step_0_normalizer_processor.safetensors"


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return random_tiny()


def with_stats(folder: Path, shards: Path, edit: Callable[[dict], None] | None = None) -> Path:
    """`folder` with LeRobot's normalizer files beside the weights, holding the dataset's statistics
    (after `edit`), as `trainkit export` writes them."""
    from datakit.shards.index import load_index
    from trainkit.weights.norm_stats import stats_files

    stats = json.loads(json.dumps({p: load_index(shards).stats[p] for p in ("state", "action")}))
    if edit:
        edit(stats)
    for name, data in stats_files(stats, "lerobot", "quantile").items():
        (folder / name).write_bytes(data)
    return folder


def refused(capsys, folder: Path, shards: Path, out: Path, *extra: str) -> str:
    """`trainkit run` from `folder`: exit 2 with one line, before any step; the line."""
    code, err = cli_run(capsys, f"data.shards={shards}", f"output.dir={out}", f"model.init_from={folder}",
                        "train.steps=2", "parallel.fsdp=none", "parallel.ac_stride={}", *extra)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("trainkit: "), err
    assert "Traceback" not in err and not (out / "metrics.jsonl").exists(), err
    return err


# --- defect 1: damaged safetensors ----------------------------------------------------------------

def _split(b: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def _join(header: object, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _by_offset(h: dict) -> list[str]:
    return sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])


def _edit(fn: Callable[[dict], None]) -> Callable[[bytes], bytes]:
    def go(b: bytes) -> bytes:
        h, data = _split(b)
        fn(h)
        return _join(h, data)
    return go


def _shift(h: dict, key: str, by: int) -> None:
    h[key]["data_offsets"] = [x + by for x in h[key]["data_offsets"]]


class Payload:
    """Unpickling it creates the folder MARKER: proof that code from the file ran."""
    marker = ""

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _duplicate(b: bytes) -> bytes:
    """The second tensor's entry under the first one's name: JSON that `json.loads` reads without
    complaint (the last value wins), hiding a tensor."""
    h, data = _split(b)
    first, second = _by_offset(h)[:2]
    items = ",".join(f"{json.dumps(first if k == second else k)}:{json.dumps(v)}" for k, v in h.items())
    raw = ("{" + items + "}").encode()
    return struct.pack("<Q", len(raw)) + raw + data


def _pickle(b: bytes) -> bytes:
    return pickle.dumps(Payload())


def _torch_save(legacy: bool) -> Callable[[bytes], bytes]:
    def go(b: bytes) -> bytes:
        import io

        buf = io.BytesIO()
        torch.save({"w": torch.ones(2), "x": Payload()}, buf, _use_new_zipfile_serialization=not legacy)
        return buf.getvalue()
    return go


DAMAGE = {  # kind -> (bytes -> damaged bytes, what the line says)
    "empty": (lambda b: b"", "is empty"),
    "short": (lambda b: b[:5], "too short"),
    "truncated_header": (lambda b: b[:8 + struct.unpack("<Q", b[:8])[0] // 2], "truncated"),
    "truncated_data": (lambda b: b[:-7], "truncated"),
    "huge_header_length": (lambda b: struct.pack("<Q", 2**62) + b[8:], "header length"),
    "header_not_json": (lambda b: b[:8] + b"\xff" * struct.unpack("<Q", b[:8])[0] + _split(b)[1], "not JSON"),
    "header_not_object": (lambda b: _join([1, 2], _split(b)[1]), "not a JSON object"),
    "duplicate_key": (lambda b: _duplicate(b), "twice"),
    "huge_offsets": (_edit(lambda h: _shift(h, _by_offset(h)[-1], 2**40)), "past the end"),
    "overlapping_offsets": (_edit(lambda h: _shift(h, _by_offset(h)[1], -4)), "overlap"),
    "size_mismatch": (_edit(lambda h: h[_by_offset(h)[0]].__setitem__("shape", [1])), "needs"),
    "unknown_dtype": (_edit(lambda h: h[_by_offset(h)[0]].__setitem__("dtype", "Q7")), "dtype 'Q7'"),
    "negative_shape": (_edit(lambda h: h[_by_offset(h)[0]].__setitem__("shape", [-1])), "shape [-1]"),
    "trailing_bytes": (lambda b: b + bytes(16), "after the last tensor"),
    "pickle": (_pickle, "a pickle"),
    "torch_save_legacy": (_torch_save(legacy=True), "a pickle"),
    "torch_save_zip": (_torch_save(legacy=False), "a zip archive"),
    "text": (lambda b: b"model weights are in the other folder\n" * 40, "starts with text"),
}


@pytest.mark.parametrize("target", ["weights", "statistics"])
@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_safetensors_file_is_refused_in_one_line(model, shards_rgb, tmp_path, capsys,  # noqa: F811
                                                           kind, target):
    folder = with_stats(export(model, tmp_path / "ckpt"), shards_rgb)
    path = folder / ("model.safetensors" if target == "weights" else STATE_FILE)
    Payload.marker = str(tmp_path / "MARKER")
    damage, says = DAMAGE[kind]
    path.write_bytes(damage(path.read_bytes()))
    err = refused(capsys, folder, shards_rgb, tmp_path / "run",
                  *(["data.norm_from=checkpoint"] if target == "statistics" else []))
    assert f"trainkit: {path}: " in err and says in err, err
    assert not (tmp_path / "MARKER").exists()  # nothing in the file ran


# --- defect 2: NaN / inf weights -------------------------------------------------------------------

def _poison(key: str, value: float, dtype: torch.dtype | None = None) -> Callable[[dict], None]:
    def edit(t: dict) -> None:
        t[key] = t[key].to(dtype or t[key].dtype)
        t[key].view(-1)[1] = value
    return edit


@pytest.mark.parametrize("key, value, dtype", [
    (LM_Q, float("nan"), None), (GATE, float("inf"), None), (GATE, -float("inf"), torch.bfloat16),
    (GATE, 1e300, torch.float64),  # finite in the file, inf in float32
], ids=["nan", "inf", "bf16_minus_inf", "f64_overflow"])
def test_non_finite_weights_are_refused_naming_the_tensor(model, shards_rgb, tmp_path, capsys,  # noqa: F811
                                                          key, value, dtype):
    folder = export(model, tmp_path / "ckpt", edit=_poison(key, value, dtype))
    err = refused(capsys, folder, shards_rgb, tmp_path / "run")
    assert f"{folder / 'model.safetensors'}: tensor {key!r}" in err and "not finite" in err, err


# --- defect 5: integer weights ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype, name", [(torch.int32, "I32"), (torch.int64, "I64"), (torch.uint8, "U8"),
                                         (torch.bool, "BOOL")])
def test_integer_weights_are_refused_not_cast(model, shards_rgb, tmp_path, capsys, dtype, name):  # noqa: F811
    folder = export(model, tmp_path / "ckpt", edit=lambda t: t.__setitem__(GATE, t[GATE].to(dtype)))
    err = refused(capsys, folder, shards_rgb, tmp_path / "run")
    assert f"{folder / 'model.safetensors'}: tensor {GATE!r} is {name}, not floating point" in err, err


# --- defects 3 and 4: the checkpoint's statistics --------------------------------------------------

def _set(part: str, stat: str, i: int | None, value: float) -> Callable[[dict], None]:
    def edit(stats: dict) -> None:
        values = stats[part][stat]
        for j in (range(len(values)) if i is None else [i]):
            values[j] = value
    return edit


def _all_zero(stats: dict) -> None:
    for per in stats.values():
        for values in per.values():
            values[:] = [0.0] * len(values)


def _constant(part: str, i: int, value: float) -> Callable[[dict], None]:
    def edit(stats: dict) -> None:
        for stat in ("q01", "q99", "mean", "min", "max"):
            stats[part][stat][i] = value
        stats[part]["std"][i] = 0.0
    return edit


BAD_STATS = [  # (edit, data.norm, the key named, what the line says)
    (_set("action", "q99", 2, float("nan")), "quantile", "action.q99[2]", "nan"),
    (_set("state", "mean", 0, float("inf")), "mean_std", "observation.state.mean[0]", "inf"),
    (_set("action", "min", 1, float("nan")), "quantile", "action.min[1]", "nan"),  # a statistic not used
    (_all_zero, "quantile", "observation.state.q01[0]", "zero range"),
    (_all_zero, "mean_std", "observation.state.std[0]", "zero range"),
    (_set("state", "std", 3, -0.5), "mean_std", "observation.state.std[3]", "negative"),
    (_set("action", "q99", 4, -5.0), "quantile", "action.q99[4]", "below"),
    (_constant("action", 3, 0.5), "quantile", "action.q01[3]", "zero range"),  # the dataset varies there
]
BAD_IDS = ["nan", "inf", "nan_unused", "all_zero_quantile", "all_zero_std", "negative_std", "q99_below_q01",
           "one_constant_dim"]


@pytest.mark.parametrize("edit, norm, key, says", BAD_STATS, ids=BAD_IDS)
def test_bad_lerobot_statistics_are_refused_naming_file_and_key(model, shards_rgb, tmp_path, capsys,  # noqa: F811
                                                                edit, norm, key, says):
    folder = with_stats(export(model, tmp_path / "ckpt"), shards_rgb, edit)
    err = refused(capsys, folder, shards_rgb, tmp_path / "run", "data.norm_from=checkpoint", f"data.norm={norm}")
    assert f"trainkit: {folder / STATE_FILE}: {key}" in err and says in err, err


def test_nan_in_openpi_statistics_is_refused_naming_file_and_key(model, shards_rgb, tmp_path, capsys):  # noqa: F811
    from datakit.shards.index import load_index

    folder = export(model, tmp_path / "ckpt")
    stats = load_index(shards_rgb).stats
    path = folder / "assets" / "robot" / "norm_stats.json"
    path.parent.mkdir(parents=True)
    body = {"norm_stats": {"state": stats["state"], "actions": {**stats["action"], "q99": [float("nan")] * 6}}}
    path.write_text(json.dumps(body))  # Python writes the NaN literal openpi's json.dump would
    err = refused(capsys, folder, shards_rgb, tmp_path / "run", "data.norm_from=checkpoint")
    assert f"trainkit: {path}: norm_stats.actions.q99[0] is nan" in err, err
    body["norm_stats"]["actions"]["q99"] = [0.0] * 6
    body["norm_stats"]["actions"]["q01"] = [0.0] * 6
    path.write_text(json.dumps(body))
    err = refused(capsys, folder, shards_rgb, tmp_path / "run", "data.norm_from=checkpoint")
    assert f"trainkit: {path}: norm_stats.actions.q01[0]" in err and "in every action dimension" in err, err


def test_a_constant_dimension_is_accepted():
    """A gripper never used: one value in every frame, so std 0 and q01 == q99. LeRobot
    normalises it with an epsilon (its data maps to 0, or -1), and so does datakit: accepted."""
    from trainkit.weights.norm_stats import stats_problem

    stats = {"action": {"mean": [0.3, 1.0], "std": [0.1, 0.0], "min": [0.0, 1.0], "max": [0.9, 1.0],
                        "q01": [0.01, 1.0], "q99": [0.8, 1.0]}}
    for norm in ("quantile", "mean_std", "none"):
        assert stats_problem(stats, stats, norm, lambda part, name: name) is None, norm
    # a gripper closed in under 1% of frames: q01 == q99, yet its values span [1, 2]: quantile
    # normalisation would scale them by 1e8 (LeRobot's too); mean/std normalises them fine
    moved = {"action": {**stats["action"], "std": [0.1, 0.1], "max": [0.9, 2.0]}}
    assert "zero range" in stats_problem(moved, moved, "quantile", lambda part, name: name)
    assert stats_problem(moved, moved, "mean_std", lambda part, name: name) is None


@pytest.mark.parametrize("edit, norm, key, says", [
    (_set("action", "std", 1, -0.25), "mean_std", "stats.action.std[1]", "negative"),
    (lambda s: s["action"]["q99"].__setitem__(2, s["action"]["q01"][2]), "quantile", "stats.action.q01[2]",
     "zero range"),  # its values still span [min, max]: they would be scaled by 1e8
], ids=["negative_std", "collapsed_quantiles"])
def test_the_same_rule_holds_for_the_datasets_statistics(shards_rgb, tmp_path, capsys,  # noqa: F811
                                                         edit, norm, key, says):
    shards = copy_out(shards_rgb, tmp_path / "shards")
    edit_manifest(shards, lambda d: edit(d["stats"]))
    code, err = cli_run(capsys, f"data.shards={shards}", f"output.dir={tmp_path / 'run'}", "train.steps=2",
                        f"data.norm={norm}", "parallel.fsdp=none", "parallel.ac_stride={}")
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"trainkit: {shards / 'index.json'}: {key}" in err and says in err, err


# --- defect 6: paths a checkpoint names stay inside it ---------------------------------------------

def _state_file(folder: Path, name: str) -> None:
    pre = folder / "policy_preprocessor.json"
    body = json.loads(pre.read_text())
    body["steps"][0]["state_file"] = name
    pre.write_text(json.dumps(body))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink_out", "symlinked_dir_out"])
def test_a_state_file_outside_the_checkpoint_is_refused(model, shards_rgb, tmp_path, capsys, how):  # noqa: F811
    folder = with_stats(export(model, tmp_path / "a" / "ckpt"), shards_rgb)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(folder / STATE_FILE, outside / STATE_FILE)  # a valid file: only its place is wrong
    name = {"dotdot": f"../../outside/{STATE_FILE}", "absolute": str(outside / STATE_FILE),
            "symlink_out": STATE_FILE, "symlinked_dir_out": f"sub/{STATE_FILE}"}[how]
    if how == "symlink_out":
        (folder / STATE_FILE).symlink_to(outside / STATE_FILE)
    if how == "symlinked_dir_out":
        (folder / "sub").symlink_to(outside)
    _state_file(folder, name)
    err = refused(capsys, folder, shards_rgb, tmp_path / "run", "data.norm_from=checkpoint")
    assert f"trainkit: {folder / 'policy_preprocessor.json'}: state_file {name!r}" in err, err
    assert "outside the checkpoint folder" in err, err


def test_an_openpi_assets_folder_linked_outside_is_refused(model, shards_rgb, tmp_path, capsys):  # noqa: F811
    folder = export(model, tmp_path / "ckpt")
    elsewhere = tmp_path / "elsewhere" / "robot"
    elsewhere.mkdir(parents=True)
    (elsewhere / "norm_stats.json").write_text(json.dumps({"norm_stats": {"state": {}, "actions": {}}}))
    (folder / "assets").mkdir()
    (folder / "assets" / "robot").symlink_to(elsewhere)
    err = refused(capsys, folder, shards_rgb, tmp_path / "run", "data.norm_from=checkpoint")
    assert "assets/robot/norm_stats.json" in err and "outside the checkpoint folder" in err, err


def test_a_hugging_face_cache_snapshot_is_read(model, shards_rgb, tmp_path):  # noqa: F811
    """huggingface_hub's cache: `snapshots/<revision>/<file>` are symlinks into the repo's
    `blobs/`, outside the snapshot folder but inside the repo's cache folder: accepted."""
    from trainkit.weights.norm_stats import read_weights_stats

    plain = with_stats(export(model, tmp_path / "plain"), shards_rgb)
    repo = tmp_path / "hub" / "models--lerobot--pi05_tiny"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, f in enumerate(sorted(plain.iterdir())):
        shutil.copy(f, repo / "blobs" / f"blob{i}")
        (snapshot / f.name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    stats, source = read_weights_stats(snapshot)
    assert source == snapshot / "policy_preprocessor.json"
    assert stats == read_weights_stats(plain)[0]
