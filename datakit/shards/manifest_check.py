"""Check a parsed `index.json` before anything trusts it: types, names, ranges, totals.

The manifest is input like any other: a reader opens files it names and slices bytes at
offsets it holds. So every field is checked once, on load, and a bad one fails with
`IndexFileError` naming the file and the field (`shards[3].name: ...`), never a KeyError
deep in a reader or a path outside the output folder:
- shard names are `shard-NNNNNN.tar` (no `..`, no `/`, no absolute path);
- camera names are safe inside a tar member name (no `/`, `\\`, NUL, `..`);
- numbers have their type and sign, `frame_bytes == prod(frame_shape)` and `frame_shape` is
  what the layout gives for (height, width);
- shard row ranges tile the frames table in order, every episode's rows lie inside its
  shard's, episodes tile the table in order, totals match the lists.
What this cannot see (a wrong offset or state value inside `frames.arrow`, a damaged shard) is
`datakit verify`'s job (`datakit/verify/folder.py`).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from datakit.errors import IndexFileError, Problem
from datakit.shards.names import SHARD_NAME
from datakit.shards.stats import STAT_NAMES  # the ones readers use; others are left alone

# what each camera is in an episode (and, over all episodes, in the dataset); the index's vocabulary
CAMERA_STATUSES = ("real", "blank", "missing")

SHA256_HEX = re.compile(r"[0-9a-f]{64}")
LAYOUTS = ("rgb", "nv12")
Fields = tuple[set[str], set[str]]  # (required, optional) keys of one object


class _Check:
    """Holds the file name so each check is one line. `fail`: the manifest cannot be used at all
    (syntax, types, unsafe names): always raises. `bad`: a value disagrees with another (ranges,
    shapes, totals): raises, or with `collect` is listed and the check goes on (`datakit verify`)."""

    def __init__(self, path: Path, collect: list[Problem] | None = None):
        self.path, self.collect = path, collect

    def fail(self, field: str, problem: str) -> None:
        raise IndexFileError(self.path, f"{field}: {problem}")

    def bad(self, field: str, problem: str) -> None:
        if self.collect is None:
            self.fail(field, problem)
        self.collect.append(Problem(str(self.path), f"{field}: {problem}"))

    def obj(self, v: Any, field: str) -> dict:
        if not isinstance(v, dict):
            self.fail(field, f"expected an object, got {type(v).__name__}")
        return v

    def lst(self, v: Any, field: str, n: int | None = None) -> list:
        if not isinstance(v, list):
            self.fail(field, f"expected a list, got {type(v).__name__}")
        if n is not None and len(v) != n:
            self.fail(field, f"expected {n} values, got {len(v)}")
        return v

    def int_(self, v: Any, field: str, lo: int | None = 0) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(field, f"expected an integer, got {v!r}")
        if lo is not None and v < lo:
            self.fail(field, f"{v} is below {lo}")
        return v

    def num(self, v: Any, field: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            self.fail(field, f"expected a finite number, got {v!r}")
        return float(v)

    def str_(self, v: Any, field: str) -> str:
        if not isinstance(v, str):
            self.fail(field, f"expected a string, got {v!r}")
        return v

    def keys(self, d: dict, field: str, fields: Fields) -> None:
        required, optional = fields
        missing = sorted(required - d.keys())
        if missing:
            self.fail(field or "index", f"missing {', '.join(missing)}")
        unknown = sorted(d.keys() - required - set(optional))
        if unknown:
            self.fail(field or "index", f"unknown field {', '.join(unknown)}")


def safe_camera_name(name: str) -> bool:
    """A camera name that stays one dotted field of a tar member `<episode>/<frame>.<camera>.npy`."""
    return (bool(name) and name not in (".", "..") and not name.startswith(".")
            and not any(ch in name for ch in "/\\\0") and name.isprintable())


def check_manifest(d: Any, path: Path, schema: dict[str, Fields], collect: list[Problem] | None = None) -> None:
    """Raise IndexFileError naming `path` and the field for the first problem in the parsed
    manifest; with `collect`, inconsistent values are appended there instead (types, syntax and
    unsafe names still raise: nothing else can be checked, or trusted, after them).

    `schema` maps "index", "camera", "shard", "episode" to the (required, optional) field names
    of the dataclass each object becomes, so a field added there is known here."""
    c = _Check(path, collect)
    c.obj(d, "index")
    c.keys(d, "", schema["index"])
    c.num(d["fps"], "fps")
    if d["fps"] <= 0:
        c.fail("fps", f"{d['fps']} is not positive")
    if d["layout"] not in LAYOUTS:
        c.fail("layout", f"{d['layout']!r} is not one of {', '.join(LAYOUTS)}")
    for key in ("state_names", "action_names", "tasks"):
        for i, v in enumerate(c.lst(d[key], key)):
            c.str_(v, f"{key}[{i}]")
    for key in ("source", "options"):
        c.obj(d[key], key)
    c.lst(d["skipped"], "skipped")
    _check_stats(c, d)
    _check_cameras(c, d, schema["camera"])
    num_frames = _check_shards(c, d, schema["shard"])
    _check_episodes(c, d, num_frames, schema["episode"])


def _check_stats(c: _Check, d: dict) -> None:
    dims = {"state": len(d["state_names"]), "action": len(d["action_names"])}
    stats = c.obj(d["stats"], "stats")
    for key, dim in dims.items():
        per = c.obj(stats.get(key), f"stats.{key}")
        for name in STAT_NAMES:
            if name not in per:
                c.fail(f"stats.{key}", f"missing {name}")
            values = c.lst(per[name], f"stats.{key}.{name}")
            if values and len(c.lst(values, f"stats.{key}.{name}")) != dim:
                c.bad(f"stats.{key}.{name}", f"{len(values)} values for {dim} dimensions")
            for i, v in enumerate(values):
                c.num(v, f"stats.{key}.{name}[{i}]")


def stored_frame_shape(layout: str, height: int, width: int) -> list[int]:
    """Shape of one stored frame: rgb (H, W, 3), nv12 (H*3/2, W). Same as
    `stages.colour.stored_shape`, which imports torch: `datakit info` / `verify` should not
    pay 2 s for it (tests/datakit/reader/test_index_hardening.py checks the two agree)."""
    return [height, width, 3] if layout == "rgb" else [height * 3 // 2, width]


def _check_cameras(c: _Check, d: dict, fields: Fields) -> None:
    for name, cam in c.obj(d["cameras"], "cameras").items():
        f = f"cameras[{name!r}]"
        if not safe_camera_name(name):
            c.fail(f, "unsafe camera name (it must stay inside its tar member name: no '/', '\\', '..', NUL)")
        c.obj(cam, f)
        c.keys(cam, f, fields)
        for key in ("height", "width", "source_height", "source_width"):
            c.int_(cam[key], f"{f}.{key}", lo=1)
        if cam["status"] not in CAMERA_STATUSES:
            c.fail(f"{f}.status", f"{cam['status']!r} is not one of {', '.join(CAMERA_STATUSES)}")
        shape = [c.int_(v, f"{f}.frame_shape[{i}]", lo=1) for i, v in enumerate(c.lst(cam["frame_shape"], f"{f}.frame_shape"))]
        want = stored_frame_shape(d["layout"], cam["height"], cam["width"])
        if shape != want:
            c.bad(f"{f}.frame_shape", f"{shape} is not the {d['layout']} shape {want} of {cam['height']}x{cam['width']}")
        if c.int_(cam["frame_bytes"], f"{f}.frame_bytes", lo=1) != math.prod(shape):
            c.bad(f"{f}.frame_bytes", f"{cam['frame_bytes']} is not prod(frame_shape) = {math.prod(shape)}")


def _check_shards(c: _Check, d: dict, fields: Fields) -> int:
    """Shards tile the frames table in order; returns the number of rows they cover."""
    names: set[str] = set()
    row = 0
    for i, s in enumerate(c.lst(d["shards"], "shards")):
        f = f"shards[{i}]"
        c.keys(c.obj(s, f), f, fields)
        name = c.str_(s["name"], f"{f}.name")
        if not SHARD_NAME.fullmatch(name):
            c.fail(f"{f}.name", f"{name!r} is not a shard file name (shard-NNNNNN.tar inside the output folder)")
        if name in names:
            c.fail(f"{f}.name", f"{name!r} is listed twice")
        names.add(name)
        c.int_(s["bytes"], f"{f}.bytes")
        if not isinstance(s["sha256"], str) or not SHA256_HEX.fullmatch(s["sha256"]):
            c.fail(f"{f}.sha256", f"{s['sha256']!r} is not a sha256 hex digest")
        first, last = (c.int_(v, f"{f}.episodes") for v in c.lst(s["episodes"], f"{f}.episodes", 2))
        if first > last:
            c.bad(f"{f}.episodes", f"[{first}, {last}] is not an increasing range")
        start, stop = (c.int_(v, f"{f}.rows") for v in c.lst(s["rows"], f"{f}.rows", 2))
        if start != row or stop < start:
            c.bad(f"{f}.rows", f"[{start}, {stop}) does not continue the previous shard's rows (ending at {row})")
        if c.int_(s["num_frames"], f"{f}.num_frames") != stop - start:
            c.bad(f"{f}.num_frames", f"{s['num_frames']} differs from its rows [{start}, {stop})")
        row = max(row, stop)
    for key, want in (("num_shards", len(d["shards"])), ("num_frames", row)):
        if key in d and c.int_(d[key], key) != want:
            c.bad(key, f"{d[key]} differs from the shard list ({want})")
    return row


def _check_episodes(c: _Check, d: dict, num_frames: int, fields: Fields) -> None:
    shards, row, seen = d["shards"], 0, set()
    for i, e in enumerate(c.lst(d["episodes"], "episodes")):
        f = f"episodes[{i}]"
        c.keys(c.obj(e, f), f, fields)
        ep = c.int_(e["episode_index"], f"{f}.episode_index")
        length = c.int_(e["length"], f"{f}.length", lo=1)
        shard = c.int_(e["shard"], f"{f}.shard")
        start = c.int_(e["row_start"], f"{f}.row_start")
        c.str_(e["task"], f"{f}.task")
        for cam, status in c.obj(e["camera_status"], f"{f}.camera_status").items():
            if cam not in d["cameras"]:
                c.fail(f"{f}.camera_status", f"unknown camera {cam!r}")
            if status not in CAMERA_STATUSES:
                c.fail(f"{f}.camera_status[{cam!r}]", f"{status!r} is not one of {', '.join(CAMERA_STATUSES)}")
        if ep in seen:
            c.bad(f"{f}.episode_index", f"episode {ep} is listed twice")
        seen.add(ep)
        if start != row:
            c.bad(f"{f}.row_start", f"{start} does not follow the previous episode (expected {row})")
        row = start + length
        if shard >= len(shards):
            c.bad(f"{f}.shard", f"shard {shard} is out of range (the index has {len(shards)})")
            continue
        lo, hi = shards[shard]["rows"]
        if not (lo <= start and start + length <= hi):
            c.bad(f"{f}.row_start", f"rows [{start}, {start + length}) lie outside shard {shard}'s rows [{lo}, {hi})")
        first, last = shards[shard]["episodes"]
        if not first <= ep <= last:
            c.bad(f"{f}.shard", f"episode {ep} is outside shard {shard}'s episodes [{first}, {last}]")
    held: dict[int, list[int]] = {}
    for e in d["episodes"]:
        if e["shard"] < len(shards):
            held.setdefault(e["shard"], []).append(e["episode_index"])
    for s_i, eps in sorted(held.items()):  # a shard whose episodes were all skipped holds none
        if shards[s_i]["episodes"] != [min(eps), max(eps)]:
            c.bad(f"shards[{s_i}].episodes", f"{shards[s_i]['episodes']} but it holds episodes {min(eps)}..{max(eps)}")
    if row != num_frames:
        c.bad("episodes", f"cover {row} rows, the shards {num_frames}")
    if "num_episodes" in d and c.int_(d["num_episodes"], "num_episodes") != len(d["episodes"]):
        c.bad("num_episodes", f"{d['num_episodes']} differs from the episode list ({len(d['episodes'])})")
