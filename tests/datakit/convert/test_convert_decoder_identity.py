"""The decoder is no part of a conversion: every backend, and `--decoder auto` whatever ranking
file this machine has, gives the same shards, the same index and so the same identity (the
digests of checksums.json), for H.264, HEVC and AV1 sources. This is what lets the decoder choice
stay out of the options and the source fingerprint (convert/config.py, convert/fingerprint.py)."""
from __future__ import annotations

import json

import pytest

from datakit.convert import convert
from datakit.convert.config import ConvertConfig
from datakit.decoders import BACKENDS, BackendUnavailable, backend_module
from datakit.shards.index import conversion_id
from datakit.synth import make_lerobot_dataset
from helpers import tree_bytes


def _available() -> list[str]:
    out = []
    for name in BACKENDS:
        try:
            backend_module(name)
        except BackendUnavailable:
            continue
        out.append(name)
    return out


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_every_decoder_gives_the_same_conversion(codec, tmp_path, monkeypatch):
    backends = _available()
    if len(backends) < 2:
        pytest.skip(f"one decoder installed ({backends}): nothing to compare")
    src = make_lerobot_dataset(tmp_path / "src", version="v2.1", episode_lengths=(5, 4), height=48, width=64,
                               codec=codec, detail=1.0)
    ranking = tmp_path / "decoders.json"
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(ranking))
    runs = {}
    for decoder in [*backends, "auto"]:
        out = tmp_path / f"out-{decoder}"
        s = convert(src, out, ConvertConfig(decoder=decoder, workers=1, progress=False))
        runs[decoder] = (tree_bytes(out), conversion_id(out), set(s.decoders))
    # auto decided by a ranking file on this machine: the last installed backend first
    ranking.write_text(json.dumps({"conversion": {codec: [backends[-1]]}, "machine": {"date": "today"}}))
    s = convert(src, tmp_path / "out-ranked", ConvertConfig(workers=1, progress=False))
    assert set(s.decoders) == {backends[-1]} and "on this machine by datakit bench-decoders" in s.decoder_why
    runs["ranked"] = (tree_bytes(tmp_path / "out-ranked"), conversion_id(tmp_path / "out-ranked"), set(s.decoders))
    assert {d for _, _, used in runs.values() for d in used} == set(backends)  # each one really decoded
    first = runs[backends[0]]
    for decoder, (tree, ident, _) in runs.items():
        assert ident == first[1], f"{decoder}: another identity than {backends[0]}"
        assert tree == first[0], f"{decoder}: other bytes than {backends[0]}"
