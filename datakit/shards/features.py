"""The feature-folder format: what `datakit encode` writes and what the loader reads.

A feature folder keeps the shard contract (docs/shard-format.md) with other contents:
- `shard-NNNNNN.tar`: plain tar. Shard i holds the clips of the source folder's shard i, one key
  per clip (`<episode:06d>/<start:06d>`, the clip's first source frame), members
  `<key>.latents.npy` (C, T', H', W'), `<key>.cond_latents.npy` (C, T'-1, H', W', optional),
  `<key>.image.npy` (257, 1280, optional) and `<key>.json`. With a text encoder, one more shard
  holds each distinct prompt once: `prompt/<id:06d>.text.npy` (tokens, width), real tokens only.
  A cached backbone (`trainkit encode-backbone`, docs/gr00t.md) holds one key per anchor frame
  (`<episode:06d>/<frame:06d>`) with `vl`, `vl_masks` and `action_is_pad` (BACKBONE_FIELDS).
- `frames.arrow`: one row per clip (the name is the shards' per-row table, so checksums.json,
  the reader identity check and the cleanup of an unfinished run apply unchanged): episode_index,
  start, task_index, prompt (-1: none), shard, state (at the clip's first frame), action (every
  source frame the clip spans, flattened), and `offset/<field>` per tensor field.
- `index.json` (format `datakit-features`): the fingerprint (what was encoded, with what, how),
  each field's dtype and shape, the prompts (text, shard, offset, tokens), the source's state /
  action names and statistics, per shard name/bytes/sha256/clip rows; `checksums.json` last.
bfloat16 has no numpy dtype: such members are `.npy` files of `<u2` (the raw bits), and the
index names the real dtype. The loader reads the index's offsets and never parses a header.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from datakit.errors import IndexFileError
from datakit.shards import checksums
from datakit.shards.index import (
    OFFSET_PREFIX, ShardEntry, _fields, _reject_constant, _NotStrict, load_frames,
    write_checksums, write_frames, write_atomic,
)
from datakit.shards.manifest_check import SHA256_HEX, _Check
from datakit.shards.names import FRAMES_NAME, MANIFEST_NAME, SHARD_NAME

FEATURES_FORMAT = "datakit-features"
FEATURES_VERSION = 1
CLIP_FIELDS = ("latents", "cond_latents", "image")  # per-clip tensors, in member order
# per-sample tensors of a cached VL backbone (trainkit's GR00T, `trainkit encode-backbone`): the hidden
# states at select_layer (T, width), their masks (3, T) uint8 (image token, valid, seen by the VL
# self-attention) and the action chunk's pad mask (horizon,) uint8; a sample is one anchor frame
BACKBONE_FIELDS = ("vl", "vl_masks", "action_is_pad")
PROMPT_KEY = "prompt/{prompt:06d}"
# dtype name -> (torch dtype, the .npy dtype its bits are stored as)
DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "float32": (torch.float32, "<f4"), "float16": (torch.float16, "<f2"), "bfloat16": (torch.bfloat16, "<u2"),
    "uint8": (torch.uint8, "|u1"),  # masks (BACKBONE_FIELDS)
}


@dataclass
class FieldEntry:
    dtype: str  # one of DTYPES
    shape: list[int]  # per clip (latents: C, T', H', W')
    bytes: int  # prod(shape) * itemsize


@dataclass
class PromptEntry:
    text: str  # the prompt string (a task of the source)
    shard: int  # position in `shards`
    offset: int  # byte offset of the (tokens, width) data
    tokens: int  # real tokens (no padding)


@dataclass
class FeatureIndex:
    """The manifest of a feature folder; the per-clip table is `frames.arrow` (`load_clips`)."""

    fingerprint: dict[str, Any]  # source identity, encoders' digests, size, clip, dtype, resize, seed
    fields: dict[str, FieldEntry]  # the per-clip tensors present
    text_width: int  # text embedding width (0: no text encoder)
    text_dtype: str  # dtype of the prompt embeddings
    prompts: list[PromptEntry]
    fps: float
    state_names: list[str]
    action_names: list[str]
    tasks: list[str]
    stats: dict[str, dict[str, list[float]]]  # the source's state / action statistics
    span: int  # source frames a clip covers: (frames - 1) * stride + 1 (the action rows per clip)
    vae: dict[str, Any]  # VAE facts a trainer needs: class, z_dim, latents_mean, latents_std
    shards: list[ShardEntry]  # rows: clip rows; num_frames: clips
    num_clips: int = 0
    num_shards: int = 0
    format: str = FEATURES_FORMAT
    format_version: int = FEATURES_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, allow_nan=False) + "\n"


def is_feature_folder(folder: Path) -> bool:
    """`folder`'s index.json names the feature format (read cheaply; `load_features` checks it)."""
    try:
        head = (Path(folder) / MANIFEST_NAME).read_bytes()
        return json.loads(head).get("format") == FEATURES_FORMAT
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def torch_dtype(name: str) -> torch.dtype:
    return DTYPES[name][0]


def clips_schema(fields: list[str], state_dim: int, action_values: int) -> pa.Schema:
    cols = [pa.field("episode_index", pa.int64()), pa.field("start", pa.int64()), pa.field("task_index", pa.int64()),
            pa.field("prompt", pa.int64()), pa.field("shard", pa.int32()),
            pa.field("state", pa.list_(pa.float32(), state_dim)),
            pa.field("action", pa.list_(pa.float32(), action_values))]
    return pa.schema(cols + [pa.field(OFFSET_PREFIX + f, pa.int64()) for f in fields])


def write_features(out: Path, index: FeatureIndex, table: pa.Table) -> None:
    """After every shard is committed: the clip table, the manifest, then checksums.json."""
    manifest = index.to_json().encode()
    write_frames(Path(out) / FRAMES_NAME, table)
    write_atomic(Path(out) / MANIFEST_NAME, manifest)
    write_checksums(out)


def _check(d: Any, path: Path) -> FeatureIndex:
    c = _Check(path)
    c.obj(d, "index")
    c.keys(d, "", _fields(FeatureIndex))
    if d["format_version"] != FEATURES_VERSION:
        c.fail("format_version", f"unsupported {d['format_version']!r}")
    fields = {}
    for name, f in c.obj(d["fields"], "fields").items():
        where = f"fields.{name}"
        if name not in CLIP_FIELDS + BACKBONE_FIELDS:
            c.fail(where, f"unknown field (known: {', '.join(CLIP_FIELDS + BACKBONE_FIELDS)})")
        c.keys(c.obj(f, where), where, _fields(FieldEntry))
        if f["dtype"] not in DTYPES:
            c.fail(f"{where}.dtype", f"{f['dtype']!r} is not one of {', '.join(DTYPES)}")
        shape = [c.int_(v, f"{where}.shape", 1) for v in c.lst(f["shape"], f"{where}.shape")]
        if c.int_(f["bytes"], f"{where}.bytes") != math.prod(shape) * torch_dtype(f["dtype"]).itemsize:
            c.fail(f"{where}.bytes", "is not prod(shape) x the dtype's size")
        fields[name] = FieldEntry(f["dtype"], shape, f["bytes"])
    if "latents" not in fields and "vl" not in fields:
        c.fail("fields", "no latents (nor a cached backbone's vl)")
    shards = []
    row = 0
    for i, s in enumerate(c.lst(d["shards"], "shards")):
        where = f"shards[{i}]"
        c.keys(c.obj(s, where), where, _fields(ShardEntry))
        if not SHARD_NAME.fullmatch(c.str_(s["name"], f"{where}.name")):
            c.fail(f"{where}.name", f"{s['name']!r} is not shard-NNNNNN.tar")
        if not SHA256_HEX.fullmatch(c.str_(s["sha256"], f"{where}.sha256")):
            c.fail(f"{where}.sha256", "not a sha256 hex digest")
        rows = [c.int_(v, f"{where}.rows") for v in c.lst(s["rows"], f"{where}.rows", 2)]
        if rows[0] != row or rows[1] < rows[0]:
            c.fail(f"{where}.rows", f"{rows} does not continue the clip rows at {row}")
        row = rows[1]
        shards.append(ShardEntry(s["name"], c.int_(s["bytes"], f"{where}.bytes"), s["sha256"],
                                 [c.int_(v, f"{where}.episodes", None) for v in c.lst(s["episodes"], where, 2)],
                                 rows, c.int_(s["num_frames"], f"{where}.num_frames")))
    if row != c.int_(d["num_clips"], "num_clips") or len(shards) != c.int_(d["num_shards"], "num_shards"):
        c.fail("num_clips", "totals differ from the shard list")
    prompts = []
    for i, p in enumerate(c.lst(d["prompts"], "prompts")):
        where = f"prompts[{i}]"
        c.keys(c.obj(p, where), where, _fields(PromptEntry))
        e = PromptEntry(c.str_(p["text"], where), c.int_(p["shard"], f"{where}.shard"),
                        c.int_(p["offset"], f"{where}.offset"), c.int_(p["tokens"], f"{where}.tokens", 1))
        width = c.int_(d["text_width"], "text_width", 1)
        if e.shard >= len(shards) or e.offset + e.tokens * width * torch_dtype(d["text_dtype"]).itemsize > \
                shards[e.shard].bytes:
            c.fail(where, "lies outside its shard")
        prompts.append(e)
    return FeatureIndex(**{**d, "fields": fields, "shards": shards, "prompts": prompts})


def load_features(out: Path, *, against_checksums: bool = True) -> FeatureIndex:
    """The checked manifest of a feature folder, its bytes matched against checksums.json
    (`verify` lists a mismatch itself: against_checksums=False); IndexFileError naming the file."""
    path = Path(out) / MANIFEST_NAME
    try:
        text = path.read_bytes()
        d = json.loads(text, parse_constant=_reject_constant)
    except FileNotFoundError:
        raise IndexFileError(path, "missing: not a feature folder, or its encode has not finished") from None
    except (OSError, ValueError, _NotStrict, RecursionError) as e:
        raise IndexFileError(path, f"unreadable or not strict JSON ({e})") from None
    if not isinstance(d, dict) or d.get("format") != FEATURES_FORMAT:
        raise IndexFileError(path, f"not a {FEATURES_FORMAT} index")
    index = _check(d, path)
    if against_checksums:
        checksums.check(out, MANIFEST_NAME, checksums.digest(text))
    return index


def load_clips(out: Path, index: FeatureIndex, *, against_checksums: bool = True) -> pa.Table:
    """The per-clip table, memory-mapped, checked against the manifest and checksums.json."""
    path = Path(out) / FRAMES_NAME
    table = load_frames(out)  # readable Arrow, one batch
    want = clips_schema(list(index.fields), len(index.state_names), index.span * len(index.action_names))
    if not table.schema.equals(want) or table.num_rows != index.num_clips:
        raise IndexFileError(path, f"columns or rows ({table.num_rows}) differ from the feature index "
                                   f"({index.num_clips} clips)")
    if against_checksums:
        checksums.check(out, FRAMES_NAME, checksums.digest(path.read_bytes(), path.stat()))
    return table


def check_clip_reads(index: FeatureIndex, shard: np.ndarray, offsets: dict[str, np.ndarray], path: Path) -> None:
    """Every clip's tensors lie inside its shard (a reader never reads past one)."""
    sizes = np.array([s.bytes for s in index.shards], np.int64)
    if shard.size and (shard.min() < 0 or shard.max() >= len(sizes)):
        raise IndexFileError(path, "a clip names a shard the index does not list")
    for name, off in offsets.items():
        bad = (off < 0) | (off + index.fields[name].bytes > sizes[shard])
        if bad.any():
            raise IndexFileError(path, f"clip row {int(np.flatnonzero(bad)[0])}: offset/{name} lies outside its shard")

