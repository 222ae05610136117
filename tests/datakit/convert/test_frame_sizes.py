"""A frame whose size differs from the declared camera size is bad input (an embedded image of
another size would otherwise be written under the declared shape, and read back as garbage)."""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from datakit.cli import main
from datakit.synth import make_lerobot_dataset

CAM = "observation.images.wrist"


def test_embedded_image_of_another_size(tmp_path, capsys):
    ds = make_lerobot_dataset(tmp_path / "ds", version="v2.1", episode_lengths=(4, 3), cameras=(CAM,),
                              image_cameras=(CAM,), blank_cameras=(), height=64, width=96)
    path = ds / "data/chunk-000/episode_000001.parquet"
    table = pq.read_table(path)
    buf = io.BytesIO()
    Image.fromarray(np.zeros((32, 48, 3), np.uint8)).save(buf, format="PNG")
    values = table[CAM].to_pylist()
    values[2] = {"bytes": buf.getvalue(), "path": "small.png"}
    i = table.column_names.index(CAM)
    pq.write_table(table.set_column(i, table.schema.field(CAM), pa.array(values, type=table.schema.field(CAM).type)),
                   path)
    rc = main(["convert", str(ds), str(tmp_path / "out"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "episode_000001.parquet" in err and f"image column {CAM} frame 2 is 32x48" in err and "64x96" in err, err
