"""Reading a DCP checkpoint folder without running code from it.

Approach: a restricted unpickler for DCP's `.metadata`, allowing only DCP's own metadata classes.
What a folder could make run, and what stops it:
- `.metadata` is a pickle, and `FileSystemReader.read_metadata` calls `pickle.load` on it. Ours
  (`CheckedReader`) unpickles it with `MetadataUnpickler`, whose `find_class` admits only the
  classes DCP writes there (its metadata dataclasses, `_StorageInfo`, `torch.Size`, torch dtypes,
  layouts and memory formats, a path): a pickle naming anything else (`builtins.exec`, `os.system`, a
  wrapper that runs code and returns genuine metadata) is refused before any object is built.
  Every route to code in a pickle goes through `find_class` (GLOBAL, STACK_GLOBAL, INST, OBJ and
  the copyreg extension codes), so refusing there is enough; persistent ids are refused by the
  stock Unpickler.
- Tensor entries are read by DCP with `torch.load(weights_only=True)` (torch 2.11 and 2.13 alike),
  torch's own restricted unpickler.
- Bytes entries are the other route: DCP's `DefaultLoadPlanner.load_bytes` calls
  `torch.load(weights_only=False)`, and a planted `.metadata` could declare any key a bytes entry.
  trainkit writes none (its small state is JSON in the manifest), so metadata declaring one is
  refused, and `TensorsOnlyPlanner.load_bytes` refuses too, should one get through.
- The storage entries may only name files the manifest lists (no path outside the folder).

Why not a trainkit manifest alone: a manifest only proves the files are the ones written with it,
and whoever can plant a pickle in output.dir can rewrite the manifest to match. The manifest
(`manifest.py`) is the integrity check; the unpickler is the safety boundary.
Only public DCP API is used (`FileSystemReader`, `DefaultLoadPlanner`, the metadata classes).
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

METADATA_NAME = ".metadata"  # DCP's file name for the global metadata (FileSystemWriter)

_DCP_CLASSES = {("torch.distributed.checkpoint.metadata", name) for name in (
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
_ALLOWED = _DCP_CLASSES | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # looks a layout up by name among torch's own
    *((module, name) for module in ("pathlib", "pathlib._local") for name in ("PosixPath", "PurePosixPath")),
}
# torch.float32, torch.strided, torch.contiguous_format, ...: values, looked up by name
_TORCH_VALUES = {k for k, v in vars(torch).items() if isinstance(v, (torch.dtype, torch.layout, torch.memory_format))}


class UnsafeCheckpoint(Exception):
    """A checkpoint file holds something trainkit never writes there; `str()` says what."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata, refusing every global outside DCP's own metadata classes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and name in _TORCH_VALUES):
            return super().find_class(module, name)
        raise UnsafeCheckpoint(f"it references {module}.{name}, which DCP metadata never holds")


def read_metadata(folder: Path, files: set[str]) -> Metadata:
    """The checked DCP metadata of `folder`, whose manifest lists `files`."""
    path = Path(folder) / METADATA_NAME
    with open(path, "rb") as f:
        try:
            md = MetadataUnpickler(f).load()
        except UnsafeCheckpoint:
            raise
        except Exception as e:  # noqa: BLE001 - a damaged pickle: any error of the stock unpickler
            raise UnsafeCheckpoint(f"unreadable ({type(e).__name__}: {e})") from None
    if type(md) is not Metadata:
        raise UnsafeCheckpoint(f"holds a {type(md).__name__}, not DCP metadata")
    if not isinstance(md.state_dict_metadata, dict) or not isinstance(md.storage_data, dict):
        raise UnsafeCheckpoint("is not shaped like DCP metadata")
    bytes_keys = [k for k, v in md.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)]
    if bytes_keys:
        raise UnsafeCheckpoint(f"declares bytes entries ({bytes_keys[0]}, ...), which trainkit never writes")
    for info in md.storage_data.values():
        rel = getattr(info, "relative_path", None)
        if rel not in files:
            raise UnsafeCheckpoint(f"points at file {rel!r}, which the manifest does not list")
    return md


class CheckedReader(FileSystemReader):
    """`FileSystemReader` whose metadata comes through `read_metadata` (no stock pickle.load)."""

    def __init__(self, folder: Path, files: set[str]):
        super().__init__(str(folder))
        self._folder, self._files = Path(folder), files

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        md = read_metadata(self._folder, self._files)
        if md.storage_meta is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = getattr(self, "load_id", None)  # as FileSystemReader does
        return md


class TensorsOnlyPlanner(DefaultLoadPlanner):
    """The default planner, except that a bytes entry (unpickled with weights_only=False) is refused."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        raise UnsafeCheckpoint(f"holds a bytes entry {read_item.dest_index.fqn!r}, which trainkit never writes")
