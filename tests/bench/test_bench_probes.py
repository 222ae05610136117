"""bench/gpu/probes/ holds exact copies of the shared probes (../shared/probes/*.py), each sha256 in
bench/gpu/probes/SHA256SUMS (`sha256sum` format: `cd bench/gpu/probes && sha256sum -c SHA256SUMS`), and the
repository's own probes (OWN: written here, no shared original, e.g. the DreamZero probe of the real
Wan block).

A copy that drifts from its recorded hash fails here on any clone. Where the shared folder is
present (/work/shared/probes, or ../shared/probes beside the repository), a recorded hash that
differs from the shared file fails too: the copy is stale, refresh it and SHA256SUMS together.
Why it matters: an old copy of pi05_fsdp_probe.py initialised its norm weights to 0, so its GEMMs
ran on zeros at a higher clock and it reported 52.96 samples/s where the current probe gives 45.09.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "bench" / "gpu" / "probes"
SHARED = [Path("/work/shared/probes"), ROOT.parent / "shared" / "probes"]
OWN = {"dreamzero_wan_probe.py", "gr00t_n17_probe.py"}  # probes of this repository (issues 29, 31), not copies


def recorded() -> dict[str, str]:
    out = {}
    for line in (PROBES / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, _, name = line.partition("  ")
            out[name.lstrip("*")] = digest
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_probe_is_recorded_and_matches_its_hash():
    sums = recorded()
    files = sorted(p.name for p in PROBES.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    assert files == sorted({*sums, *OWN}), "bench/gpu/probes/ holds only the recorded copies of the shared probes and OWN"
    assert not OWN & set(sums), "an own probe is not a copy of a shared one"
    for name, digest in sums.items():
        assert sha256(PROBES / name) == digest, f"bench/gpu/probes/{name} drifted from bench/gpu/probes/SHA256SUMS"


@pytest.mark.parametrize("shared", [p for p in dict.fromkeys(SHARED) if p.is_dir()] or
                         [pytest.param(None, marks=pytest.mark.skip(reason="no shared probes folder here"))])
def test_recorded_hashes_are_the_shared_probes(shared):
    for name, digest in recorded().items():
        assert (shared / name).is_file(), f"{shared / name} is gone: the copy in bench/gpu/probes/ has no source"
        assert sha256(shared / name) == digest, (f"bench/gpu/probes/{name} is stale: {shared / name} changed; copy it "
                                                 "and update bench/gpu/probes/SHA256SUMS")
