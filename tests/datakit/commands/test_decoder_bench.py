"""datakit bench-decoders: the runner on tiny generated videos, the JSON schema, missing and
crashing backends reported as records, wrong frames caught (with a deliberately wrong decoder),
rankings and the recommendation file that `convert --decoder auto` reads. No timing asserts."""
from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

from datakit.cli import main
from datakit.commands.bench_decoders import crosscheck, recommend, runner
from datakit.commands.bench_decoders.measure import Job, Setting, measure
from datakit.commands.bench_decoders.patterns import PATTERNS, get_pattern
from datakit.commands.bench_decoders.videos import VideoSpec, from_dataset, generate
from datakit.decoders import CONVERT_ORDER, backend_module, backend_order

REQUIRED = ("decoder", "version", "codec", "height", "width", "pattern", "threads", "frames", "wall_s_median",
            "frames_per_s", "cpu_ms_per_frame", "peak_rss_mb", "frames_correct", "error")
FAST = dict(repeats=2, min_repeats=1, max_s=0.1)


# --- decoders for the worker to load by "module:opener" (module = this test file) ----------------

class OffByOne:
    """Returns frame i+1 where frame i was asked for: the bug the frame check must catch."""

    def __init__(self, path, **kw):
        self._d = backend_module("pyav").open_video(path, **kw)
        self.info = self._d.info

    def read_range(self, start, stop, chunk=16):
        n = self.info.num_frames
        for arr in self._d.read_range(min(start + 1, n - 1), min(stop + 1, n), chunk):
            yield arr

    def get_frames(self, indices):
        return self._d.get_frames([min(i + 1, self.info.num_frames - 1) for i in indices])

    def close(self):
        self._d.close()


def open_off_by_one(path, **kw):
    return OffByOne(path, **kw)


def open_crash(path, **kw):
    os.kill(os.getpid(), signal.SIGSEGV)


def open_pyav(path, **kw):
    return backend_module("pyav").open_video(path, **kw)


ME = __name__


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return generate(VideoSpec("h264", 64, 128, gop=None, frames=40, fps=10), tmp_path_factory.mktemp("v"))


# --- patterns ------------------------------------------------------------------------------------

def test_patterns_stay_in_range_and_repeat_by_seed():
    for p in PATTERNS.values():
        reads = p.reads(50, seed=3)
        assert reads == p.reads(50, seed=3)
        assert all(0 <= i < 50 for r in reads for i in r.indices)
    clip = get_pattern("clip").reads(50, 0)
    assert all(r.contiguous and r.indices == tuple(range(r.indices[0], r.indices[0] + 33)) for r in clip)
    assert get_pattern("clip").reads(10, 0)[0].indices == tuple(range(10))  # shorter than a clip
    mv = get_pattern("multiview").reads(50, 0)
    assert {r.view for r in mv} == {0, 1, 2} and len({r.indices for r in mv[:3]}) == 1
    assert get_pattern("sequential").frames_per_repeat(50) == 50
    with pytest.raises(ValueError):
        get_pattern("zigzag")


# --- the timing loop, in process -----------------------------------------------------------------

def test_measure_counts_correct_frames(tiny):
    job = Job(backend="pyav", video=tiny, pattern="multiview", **FAST)
    res = measure(job, open_pyav)
    assert res["frames_checked"] > 0 and res["frames_correct"] == res["frames_checked"]
    assert res["check"] == "barcode" and res["wrong_examples"] == []
    assert len(res["walls"]) >= 1 and all(f == 12 for f in res["frames"])


@pytest.mark.parametrize("pattern", ["sequential", "single"])
def test_measure_catches_a_wrong_decoder(tiny, pattern):
    res = measure(Job(backend="x", video=tiny, pattern=pattern, **FAST), open_off_by_one)
    assert res["frames_correct"] < res["frames_checked"]
    asked, got = res["wrong_examples"][0]
    assert got == asked + 1


def test_measure_reopen_setting(tiny):
    opened = []

    def counting(path, **kw):
        opened.append(path)
        return open_pyav(path)

    job = Job(backend="x", video=tiny, pattern="single", setting=Setting(reuse=False), repeats=1, min_repeats=1)
    measure(job, counting)
    assert len(opened) == 2 * PATTERNS["single"].samples  # warm-up + one repeat, one open per sample


# --- the runner: fresh processes, failures as records ---------------------------------------------

def test_run_job_record_fields(tiny):
    rec = runner.run_job(Job(backend="pyav", video=tiny, pattern="clip", **FAST), timeout=60)
    assert rec["error"] is None, rec["error"]
    assert set(REQUIRED) <= set(rec)
    assert rec["frames_correct"] == rec["frames_checked"] > 0
    assert rec["codec"] == "h264" and (rec["height"], rec["width"]) == (64, 128)
    assert rec["frames_per_s"] > 0 and rec["peak_rss_mb"] > 0 and rec["version"]


def test_run_job_workers_sum_frames(tiny):
    rec = runner.run_job(Job(backend="pyav", video=tiny, pattern="single", setting=Setting(workers=2), **FAST))
    assert rec["error"] is None and rec["workers"] == 2
    assert rec["frames"] == 2 * PATTERNS["single"].samples


def test_missing_backend_is_an_error_record(tiny):
    rec = runner.run_job(Job(backend="decord", video=tiny, pattern="single", block_modules=("decord",), **FAST))
    assert rec["error"].startswith("unavailable") and "decord" in rec["error"]
    assert rec["frames_per_s"] is None
    version, err = runner.probe_backend("no_such_module_xyz:open")
    assert version is None and "no_such_module_xyz" in err


def test_crash_is_an_error_record(tiny):
    rec = runner.run_job(Job(backend=f"{ME}:open_crash", video=tiny, pattern="single", **FAST), timeout=60)
    assert "SIGSEGV" in rec["error"]


# --- the command end to end ----------------------------------------------------------------------

def _bench(tmp_path, tiny, backends, *extra):
    out = tmp_path / "r"
    rc = main(["bench-decoders", "--video", str(tiny.path), "--backends", backends,
               "--patterns", "sequential,clip,single", "--repeats", "2", "--max-job-s", "0.1",
               "--thread-sweep", "", "--workers", "2", "--no-reopen", "--json", str(out / "r.json"),
               "--markdown", str(out / "r.md"), "--plot", str(out / "r.png"),
               "--recommend-out", str(out / "rec.json"), "--no-live", *extra])
    return rc, json.loads((out / "r.json").read_text()), (out / "r.md").read_text(), out


def test_command_json_schema_recommendation_and_missing_backend(tmp_path, tiny, monkeypatch):
    rc, doc, md, out = _bench(tmp_path, tiny, "pyav,no_such_module_xyz:open")
    assert rc == 0
    assert doc["schema"] == "datakit.bench-decoders/1" and doc["machine"]["cores"] >= 1
    assert doc["backends"]["no_such_module_xyz:open"]["version"] is None
    for rec in doc["records"]:
        assert set(REQUIRED) <= set(rec)
    ok = [r for r in doc["records"] if r["decoder"] == "pyav"]
    missing = [r for r in doc["records"] if r["decoder"] != "pyav"]
    assert {r["pattern"] for r in ok if r["group"] == "main"} == {"sequential", "clip", "single"}
    assert any(r["group"] == "workers" and r["workers"] == 2 for r in ok)
    assert all(r["error"] is None and r["frames_correct"] == r["frames_checked"] for r in ok)
    assert missing and all(r["error"].startswith("unavailable") for r in missing)  # reported, not skipped
    assert "unavailable" in md and "## Recommendation" in md
    assert (out / "r.png").stat().st_size > 1000
    written = json.loads((out / "rec.json").read_text())
    assert written["recommendations"]["h264"]["sequential"] == ["pyav"]
    assert written["conversion"] == {}  # --no-reopen: nothing conversion-shaped was measured
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(out / "rec.json"))
    assert backend_order("h264") == CONVERT_ORDER  # so convert keeps the project's conversion order
    # re-rendering a saved run measures nothing and gives the same Markdown tables
    assert main(["bench-decoders", "--from-json", str(out / "r.json"), "--markdown", str(out / "again.md")]) == 0
    again = (out / "again.md").read_text()
    assert again.split("## Frames/s")[1] == md.split("## Frames/s")[1]


def test_command_fails_loudly_on_wrong_frames(tmp_path, tiny, capsys):
    rc, doc, md, _ = _bench(tmp_path, tiny, f"pyav,{ME}:open_off_by_one", "--sweep-video", "none")
    assert rc == 1
    wrong = [r for r in doc["records"] if r["decoder"].endswith("open_off_by_one")]
    assert wrong and all(r["frames_correct"] < r["frames_checked"] for r in wrong)
    assert "WRONG" in md and "WRONG FRAMES" in capsys.readouterr().out
    assert all(not line.split("use ")[1].startswith(ME) for line in doc["rankings"])  # never recommended


# --- ranking, cross-check, dataset sampling ------------------------------------------------------

def _rec(decoder, video, fps, **kw):
    return {"decoder": decoder, "video": video, "codec": "av1", "pattern": "single", "group": "main",
            "frames_per_s": fps, "frames_checked": 8, "frames_correct": 8, "error": None, **kw}


def test_rank_puts_failing_and_wrong_backends_last(tmp_path):
    records = [_rec("pyav", "a", 100), _rec("pyav", "b", 100),
               _rec("decord", "a", 900), _rec("decord", "b", None, error="unavailable: cannot read"),
               _rec("torchcodec", "a", 50), _rec("torchcodec", "b", 400),
               _rec("fast:wrong", "a", 5000, frames_correct=0), _rec("fast:wrong", "b", 5000)]
    (r,) = recommend.rank(records)
    assert r.order[:2] == ["torchcodec", "pyav"]  # geometric mean 141 > 100; both complete
    assert set(r.order[2:]) == {"decord", "fast:wrong"} and "wrong frames" in r.incomplete["fast:wrong"]
    # a run cut short: decord has no record for "b" yet; it is compared with pyav on "a" alone
    (r2,) = recommend.rank([_rec("pyav", "a", 100), _rec("pyav", "b", 10), _rec("decord", "a", 300)])
    assert r2.order == ["decord", "pyav"] and not r2.incomplete and r2.fps["pyav"] == pytest.approx(100)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"recommendations": {"h264": {"sequential": ["decord"]}}}))
    doc = recommend.write_recommendations(path, [r], {"cores": 2})
    assert doc["recommendations"]["av1"]["single"] == ["torchcodec", "pyav"]
    assert doc["recommendations"]["h264"] == {"sequential": ["decord"]}  # other codecs kept


def test_crosscheck_psnr(tmp_path):
    a = np.random.default_rng(0).integers(0, 255, (8, 8, 3), dtype=np.uint8)
    b = a.copy()
    b[0, 0, 0] ^= 1
    np.savez(tmp_path / "p.npz", **{"0": a})
    np.savez(tmp_path / "q.npz", **{"0": a})
    np.savez(tmp_path / "d.npz", **{"0": b})
    out = crosscheck.compare({("v", "pyav"): tmp_path / "p.npz", ("v", "q"): tmp_path / "q.npz",
                              ("v", "d"): tmp_path / "d.npz"})
    by = {c["decoder"]: c for c in out}
    assert by["q"]["identical"] and by["q"]["reference"] == "pyav"
    assert not by["d"]["identical"] and by["d"]["psnr_db"] > 60 and not by["d"]["disagree"]


def test_videos_sampled_from_a_dataset(tmp_path):
    from datakit.synth import make_lerobot_dataset

    root = make_lerobot_dataset(tmp_path / "ds", episode_lengths=(12, 12), height=64, width=128, codec="h264")
    vids = from_dataset(root, max_videos=4)
    assert vids and all(len(v.views) == 3 for v in vids)
    numbered = [v for v in vids if v.numbered]
    assert numbered and all(v.codec == "h264" for v in vids)
