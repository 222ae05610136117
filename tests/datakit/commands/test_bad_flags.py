"""Absurd flags of `datakit plan` and `datakit doctor` are refused when the command line is parsed,
naming the flag (exit 2, no traceback); `plan` refuses an index that does not match its
checksums.json (edited, unfinished, nested too deeply to parse), local or s3://."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from datakit.cli import main
from datakit.commands.doctor import main as doctor_main

DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON that json.loads cannot parse without a RecursionError


def _parse_error(capsys, argv: list[str]) -> str:
    """The last stderr line of a command line refused by argparse (exit 2)."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err, err
    return err.strip().splitlines()[-1]


PLAN_FLAGS = [("--samples-per-s", v) for v in ("0", "-1", "nan", "inf")] + \
    [("--h2d-gbps", v) for v in ("0", "-3", "nan", "inf")] + \
    [("--cache-bytes", v) for v in ("-5", "0", "inf", "nan")] + \
    [("--measure-bytes", v) for v in ("0", "-1GiB")] + \
    [("--ranks", "0"), ("--ranks", "-2"), ("--ranks-per-node", "0")] + \
    [("--measure-seconds", v) for v in ("0", "-1", "nan")] + [("--workers", v) for v in ("-1", "two")]


@pytest.mark.parametrize("flag,value", PLAN_FLAGS, ids=[f"{f}={v}" for f, v in PLAN_FLAGS])
def test_plan_refuses_absurd_flags(converted, capsys, flag, value):
    base = ["plan", str(converted), "--samples-per-s", "100", "--batch-size", "2", "--json"]
    line = _parse_error(capsys, [*base, f"{flag}={value}"])
    assert f"argument {flag}" in line and value in line, line


def test_plan_still_takes_sensible_flags(converted, capsys):
    assert main(["plan", str(converted), "--samples-per-s", "100", "--batch-size", "2", "--h2d-gbps", "0.5",
                 "--cache-bytes", "1MiB", "--ranks", "2", "--ranks-per-node", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["plan"]["ranks"] == 2 and doc["plan"]["cache_bytes"] == 1 << 20


DOCTOR_FLAGS = [("--workers", "0"), ("--workers", "-3"), ("--frozen-seconds", "-1"), ("--frozen-seconds", "0"),
                ("--frozen-seconds", "nan"), ("--ignore", "blank_camer"), ("--ignore", "blank_camera,nope")]


@pytest.mark.parametrize("flag,value", DOCTOR_FLAGS, ids=[f"{f}={v}" for f, v in DOCTOR_FLAGS])
def test_doctor_refuses_absurd_flags(tmp_path, capsys, flag, value):
    line = _parse_error(capsys, ["doctor", str(tmp_path), f"{flag}={value}"])
    assert f"argument {flag}" in line, line
    if flag == "--ignore":
        bad = value.split(",")[-1]
        assert repr(bad) in line and "blank_camera" in line, line  # names the typo and lists the kinds


def test_every_kind_the_doctor_documents_can_be_ignored():
    """Oracle: the kinds listed in datakit/commands/doctor/__init__.py's docstring (what users read)."""
    import re

    import datakit.commands.doctor
    from datakit.sources.checks import FINDING_KINDS

    section = datakit.commands.doctor.__doc__.split("Kinds of finding", 1)[1].split("\nJSON", 1)[0]
    documented = set(re.findall(r"`([a-z0-9_]+)`", section))
    assert documented <= set(FINDING_KINDS), documented - set(FINDING_KINDS)
    assert set(FINDING_KINDS) <= documented, set(FINDING_KINDS) - documented


def test_doctor_ignore_takes_comma_lists_and_repeats(dataset):
    src = dataset("v2.1")
    out = src.parent / "r.json"
    assert doctor_main([str(src), "--no-progress", "--workers", "1", "--json", str(out),
                        "--ignore", "blank_camera,frozen_camera", "--ignore", "unused_task"]) == 0


# ---- plan reads only an index that matches checksums.json ----------------------------------------

@pytest.fixture
def out(converted, tmp_path) -> Path:
    return Path(shutil.copytree(converted, tmp_path / "out"))


def _plan(capsys, root) -> tuple[int, str]:
    rc = main(["plan", str(root), "--samples-per-s", "100", "--batch-size", "2", "--json"])
    return rc, capsys.readouterr().err.strip()


def _edit_index(out: Path) -> None:
    d = json.loads((out / "index.json").read_text())
    d["shards"][0]["bytes"] *= 2  # a well-formed index that plans wrong: only checksums.json tells
    (out / "index.json").write_text(json.dumps(d, indent=1))


def _flip_frames(out: Path) -> None:
    data = bytearray((out / "frames.arrow").read_bytes())
    data[len(data) // 2] ^= 1
    (out / "frames.arrow").write_bytes(bytes(data))


def _deep_index(out: Path) -> None:
    """Nested too deeply to parse, with checksums.json rewritten to match: the parser must say so."""
    (out / "index.json").write_text(DEEP)
    sums = {n: hashlib.sha256((out / n).read_bytes()).hexdigest() for n in ("index.json", "frames.arrow")}
    (out / "checksums.json").write_text(json.dumps({"sha256": sums}))


MISMATCH = {
    "index_edited": (_edit_index, "index.json", "checksums.json"),
    "frames_edited": (_flip_frames, "frames.arrow", "checksums.json"),
    "no_checksums": (lambda o: (o / "checksums.json").unlink(), "checksums.json", "did not finish"),
    "deep_checksums": (lambda o: (o / "checksums.json").write_text(DEEP), "checksums.json", "nested"),
    "deep_index": (_deep_index, "index.json", "nested"),
}


@pytest.mark.parametrize("case", sorted(MISMATCH))
def test_plan_refuses_an_index_that_is_not_the_conversions(out, capsys, case):
    damage, name, word = MISMATCH[case]
    damage(out)
    rc, err = _plan(capsys, out)
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert str(out / name) in err and word in err, err


def test_plan_of_an_edited_remote_index_names_the_url(uploaded, capsys):
    import s3fs

    fs = s3fs.S3FileSystem()
    key = uploaded[len("s3://"):]
    d = json.loads(fs.cat_file(f"{key}/index.json"))
    d["shards"][0]["bytes"] *= 2
    fs.pipe_file(f"{key}/index.json", json.dumps(d).encode())
    fs.invalidate_cache()
    rc, err = _plan(capsys, uploaded)
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{uploaded}/index.json" in err and "checksums.json" in err and "datakit-plan-" not in err, err


@pytest.mark.parametrize("value", ["1XB", "1 GiB of data", "-1g", "inf", "nan", "1e-9", "0", "G"])
def test_a_bad_size_says_what_a_size_looks_like(tmp_path, capsys, value):
    """`--shard-size 1XB` said "invalid _size value": the line names the flag and the value, and
    says what sizes look like (plan's byte flags share the parser)."""
    line = _parse_error(capsys, ["convert", str(tmp_path / "src"), str(tmp_path / "out"), f"--shard-size={value}"])
    assert line.startswith("datakit convert: error: argument --shard-size: ") and repr(value) in line, line
    assert "_size" not in line and ("1GiB, 256MiB" in line or "at least 1 byte" in line), line


def test_sizes_read_as_written():
    from datakit.commands.flag_types import byte_size

    written = {"1GiB": 2**30, "1GB": 2**30, "1g": 2**30, "256MiB": 256 * 2**20, "1.5G": 3 * 2**29, "512k": 512 * 1024,
               "4096": 4096, " 2 TiB ": 2 * 2**40, "1b": 1, "1e9": 10**9}
    assert {text: byte_size(text) for text in written} == written
