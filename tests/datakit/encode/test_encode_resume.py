"""`datakit encode` is atomic and resumable: SIGKILLed at a point of its commit protocol (a random
tensor write inside a shard, right after a journal, between the index files), a rerun of the same
command gives the bytes of an unbroken run. The encode runs in a forked child (the encoders'
imports are paid once) that kills itself with SIGKILL at the point: no cleanup code runs."""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
from pathlib import Path

import pytest

from encode_fixtures import encoders, source  # noqa: F401
from datakit.encode import EncodeConfig, encode
from feature_faults import kill_after
from helpers import tree_bytes


def _cfg(encoders) -> EncodeConfig:  # noqa: F811
    return EncodeConfig(vae=encoders["wan2.1"], text_encoder=encoders["text"], frames=5, cond="first-frame",
                        dtype="float32", progress=False)


@pytest.fixture(scope="module")
def reference(encoders, source, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("ref") / "out"
    encode(source, out, _cfg(encoders))
    return tree_bytes(out)


def _killed_run(src: Path, out: Path, cfg: EncodeConfig, point: str, n: int) -> None:
    """In the child: arm the kill at `point` (its n-th occurrence), then encode."""
    import datakit.encode.shard as shard

    if point == "tensor":  # a shard half-written (.tar.tmp)
        shard.FeatureWriter.tensor = kill_after(shard.FeatureWriter.tensor, n)
    elif point == "journal":  # a shard committed and journaled, the next not started
        shard.write_journal = kill_after(shard.write_journal, n)
    elif point == "index":  # frames.arrow and index.json written, checksums.json not
        import datakit.shards.features as features

        features.write_checksums = kill_after(lambda out: None, 1)
    encode(src, out, cfg)
    os._exit(0)


@pytest.mark.parametrize("point", ["tensor", "journal", "index"])
def test_kill9_then_rerun_gives_identical_bytes(encoders, source, reference, tmp_path, point):  # noqa: F811
    out = tmp_path / "out"
    n = random.Random(point).randint(1, 9) if point == "tensor" else 2
    child = mp.get_context("fork").Process(target=_killed_run, args=(source, out, _cfg(encoders), point, n))
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, f"the encode finished before reaching {point}"
    assert not (out / "checksums.json").exists()  # nothing that looks finished
    s = encode(source, out, _cfg(encoders))
    if point != "tensor":  # killed after 2 journals, or after all 5 shards (4 clip shards + the text shard)
        assert s.resumed_shards == {"journal": 2, "index": 5}[point]
    assert tree_bytes(out) == reference
