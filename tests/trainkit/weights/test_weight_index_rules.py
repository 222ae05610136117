"""A checkpoint folder's weight files, as `model.init_from` reads them (trainkit/weights/load.py):
a shard or weight file symlinked outside the folder is refused (a Hugging Face cache snapshot's
links into its blobs/ are not: the positive control), a deeply nested index is one line, not a
RecursionError, and an index mapping a key to a shard that does not hold it is refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainkit.errors import CheckpointError
from trainkit.weights.load import read_weights_folder

TENSORS = {"a.weight": torch.ones(2, 3), "b.weight": torch.zeros(4)}
INDEX = "model.safetensors.index.json"


def _sharded(folder: Path, weight_map: dict[str, str] | None = None) -> Path:
    """Two shards (a.weight in the first, b.weight in the second) and their index."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    names = {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}
    for key, name in names.items():
        save_file({key: TENSORS[key]}, str(folder / name))
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map or names}))
    return folder


def test_a_shard_symlinked_out_of_the_folder_is_refused(tmp_path):
    folder = _sharded(tmp_path / "ckpt")
    outside = tmp_path / "elsewhere.safetensors"
    (folder / "model-00002-of-00002.safetensors").rename(outside)
    (folder / "model-00002-of-00002.safetensors").symlink_to(outside)
    with pytest.raises(CheckpointError, match=rf"^{folder / INDEX}: shard 'model-00002-of-00002.safetensors' is "
                                              r"outside the checkpoint folder \(it resolves to "):
        read_weights_folder(folder)


def test_one_weight_file_symlinked_out_is_refused(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    save_file(TENSORS, str(tmp_path / "real.safetensors"))
    (folder / "model.safetensors").symlink_to(tmp_path / "real.safetensors")
    with pytest.raises(CheckpointError, match="weight file 'model.safetensors' is outside the checkpoint folder"):
        read_weights_folder(folder)


def test_a_hugging_face_snapshot_s_links_into_its_blobs_are_read(tmp_path):
    """huggingface_hub's cache: snapshots/<rev>/<file> -> ../../blobs/<hash>."""
    repo = tmp_path / "models--x--y"
    folder = _sharded(repo / "snapshots" / "abc123")
    (repo / "blobs").mkdir()
    for i, f in enumerate(sorted(folder.iterdir())):
        f.rename(repo / "blobs" / f"hash{i}")
        f.symlink_to(Path("../../blobs") / f"hash{i}")
    assert read_weights_folder(folder).shapes == {"a.weight": (2, 3), "b.weight": (4,)}


def test_a_deeply_nested_index_is_one_line(tmp_path):
    folder = _sharded(tmp_path / "ckpt")
    (folder / INDEX).write_text("[" * 50000)
    with pytest.raises(CheckpointError, match=rf"^{folder / INDEX}: not a safetensors index \(RecursionError"):
        read_weights_folder(folder)
    (folder / INDEX).write_text(json.dumps({"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                                           "b.weight": "model-00002-of-00002.safetensors"}}))
    (folder / "config.json").write_text("[" * 50000)
    with pytest.raises(CheckpointError, match=rf"^{folder / 'config.json'}: unreadable \(RecursionError"):
        read_weights_folder(folder)


def test_an_index_mapping_a_key_to_the_wrong_shard_is_refused(tmp_path):
    wrong = {"a.weight": "model-00002-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors",
             "c.weight": "model-00001-of-00002.safetensors"}
    folder = _sharded(tmp_path / "ckpt", wrong)
    with pytest.raises(CheckpointError, match=rf"^{folder / INDEX}: maps tensor 'a.weight' to "
                                              "'model-00002-of-00002.safetensors'; it is in model-00001-of-00002"):
        read_weights_folder(folder)
    assert read_weights_folder(_sharded(tmp_path / "right")).shapes["a.weight"] == (2, 3)  # the same, mapped right
