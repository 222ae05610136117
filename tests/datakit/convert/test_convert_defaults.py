"""`datakit convert SRC OUT` as typed: which decoder `auto` picks (no ranking, a decode-only
ranking, a conversion ranking) and says why; how many workers (from the plan and the cores,
clamped with a warning); a progress bar that moves before the first shard is done, and plain lines
where stderr is not a terminal."""
from __future__ import annotations

import io
import json
import logging
import sys
import time

import pytest
from tqdm import tqdm

from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.convert.plan import plan_workers
from datakit.commands.bench_decoders import recommend
from datakit.decoders import CONVERT_ORDER, backend_order
from datakit.machine import available_cpus
from datakit.shards.writer import FrameWriter
from datakit.sources.episode import EpisodeRef
from datakit.synth import make_lerobot_dataset

LENGTHS = (12, 10, 8)
CAMERA_EPISODES = 3 * len(LENGTHS)  # 3 video cameras (one black) per episode


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("d") / "ds", version="v2.1", episode_lengths=LENGTHS,
                                height=64, width=96, codec="h264")


@pytest.fixture
def ranking(tmp_path, monkeypatch):
    path = tmp_path / "decoders.json"
    monkeypatch.setenv("DATAKIT_DECODER_RECOMMENDATIONS", str(path))
    return path


def _convert(src, out, **kw):
    return convert(src, out, ConvertConfig(progress=False, **kw))


# ---- the decoder ------------------------------------------------------------------------------

def test_auto_without_a_ranking_uses_the_projects_conversion_order(src, tmp_path, ranking):
    assert not ranking.exists()
    assert backend_order("h264") == CONVERT_ORDER == ["pyav", "torchcodec", "decord"]
    s = _convert(src, tmp_path / "out", workers=1)
    assert s.decoders == {"pyav": CAMERA_EPISODES}
    assert s.decoder_why.startswith(f"pyav ({CAMERA_EPISODES} camera-episodes): auto")
    assert "no decoder ranking on this machine" in s.decoder_why and "bench/results/convert.md" in s.decoder_why


def test_auto_ignores_a_decode_only_ranking(src, tmp_path, ranking):
    """What bench-decoders wrote before it measured conversion: decode alone, Decord first."""
    ranking.write_text(json.dumps({"recommendations": {"h264": {"sequential": ["decord", "torchcodec", "pyav"]}}}))
    assert backend_order("h264") == CONVERT_ORDER
    s = _convert(src, tmp_path / "out", workers=1)
    assert s.decoders == {"pyav": CAMERA_EPISODES}
    assert "ranks decode alone" in s.decoder_why and str(ranking) in s.decoder_why


def _record(decoder, fps, cpu_util, *, reuse, pattern="sequential", group="main"):
    return {"decoder": decoder, "video": "v", "codec": "h264", "pattern": pattern, "group": group, "threads": 1,
            "workers": 1, "reuse": reuse, "frames_per_s": fps, "cpu_util": cpu_util, "frames_checked": 9,
            "frames_correct": 9, "error": None}


def test_auto_uses_a_conversion_ranking_scored_per_busy_core(src, tmp_path, ranking):
    records = [  # decode alone: decord fastest; reopened per file: torchcodec fastest per busy core
        _record("decord", 2000, 1.25, reuse=True), _record("torchcodec", 900, 1.0, reuse=True),
        _record("pyav", 450, 1.0, reuse=True),
        _record("decord", 700, 1.6, reuse=False, group="reuse"),  # 437 frames/s per core
        _record("torchcodec", 600, 1.0, reuse=False, group="reuse"),  # 600
        _record("pyav", 440, 1.0, reuse=False, group="reuse"),  # 440
        _record("pyav", 999, 1.0, reuse=False, pattern="clip", group="reuse"),  # not conversion-shaped
    ]
    doc = recommend.write_recommendations(ranking, recommend.rank(records), {"date": "today"})
    assert doc["recommendations"]["h264"]["sequential"] == ["decord", "torchcodec", "pyav"]
    assert doc["conversion"]["h264"] == ["torchcodec", "pyav", "decord"]
    assert backend_order("h264") == ["torchcodec", "pyav", "decord"]
    s = _convert(src, tmp_path / "out", workers=1)
    assert s.decoders == {"torchcodec": CAMERA_EPISODES}
    assert "ranked fastest for converting h264 on this machine by datakit bench-decoders" in s.decoder_why


# ---- the workers ------------------------------------------------------------------------------

def _plan(*episodes_per_shard: int) -> list[list[EpisodeRef]]:
    n = iter(range(100))
    return [[EpisodeRef(next(n), 10, None) for _ in range(k)] for k in episodes_per_shard]


@pytest.mark.parametrize("plan,asked,want", [
    ((1,), None, 1),  # one episode: one worker (its cameras decode on their own threads)
    ((3,), None, 3),  # one shard: its episodes in parallel (the below-shard split)
    ((1, 1), None, 2),
    ((2, 2, 2, 2, 2, 2), None, 4),  # more shards than cores
    ((9,), None, 4),
    ((2, 2), 1, 1),
    ((2, 2), 3, 3),
])
def test_default_workers_come_from_the_plan_and_the_cores(plan, asked, want):
    wp = plan_workers(ConvertConfig(workers=asked), _plan(*plan), cores=4)
    assert (wp.workers, wp.clamped_from) == (want, None)


@pytest.mark.parametrize("plan,cameras,want", [
    ((8,), 2, 1),  # one shard, 2 cameras on 2 cores: camera threads fill the cores, no split (issue 27)
    ((8,), 1, 2),  # one camera: only the split keeps both cores busy
    ((12, 4), 2, 1),  # two uneven shards: one pool worker would take 3/4 of the work
    ((6, 6), 2, 2),  # two even shards: a worker each
    ((3, 3, 3, 3, 3, 3), 3, 2),
])
def test_default_workers_on_two_cores_weigh_camera_threads_against_a_pool(plan, cameras, want):
    wp = plan_workers(ConvertConfig(), _plan(*plan), cores=2, cameras=cameras)
    assert wp.workers == want, wp.why
    assert f"{cameras} camera(s) on 2 usable cores" in wp.why


def test_workers_above_the_cores_are_clamped_with_a_one_line_warning(src, tmp_path, caplog):
    cores = available_cpus()
    assert plan_workers(ConvertConfig(workers=8), _plan(5, 5), cores=2).clamped_from == 8
    with caplog.at_level(logging.WARNING, logger="datakit"):
        s = _convert(src, tmp_path / "out", workers=cores + 6, decoder="pyav", shard_size=1)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "datakit"]
    assert "\n" not in warning and f"--workers {cores + 6}" in warning and f"{cores} usable cores" in warning
    assert s.workers.startswith(f"{cores} (--workers {cores + 6}, clamped")
    assert s.index.num_frames == sum(LENGTHS)


# ---- the progress bar -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_long(tmp_path_factory):
    return make_lerobot_dataset(tmp_path_factory.mktemp("l") / "ds", version="v2.1", episode_lengths=(24, 24),
                                height=32, width=64, codec="h264")


@pytest.mark.parametrize("workers,shard_size", [(1, 1 << 30), (2, 1), (2, 1 << 30)],
                         ids=["one-process", "shard-pool", "below-the-shard"])
def test_progress_moves_within_the_first_episode(two_long, tmp_path, monkeypatch, workers, shard_size):
    """Frames show before any episode (let alone a shard) is done: per-episode counting would
    first show 24 (or 48) frames. On a terminal: the bar, saying what it waits for at 0%."""
    out = tmp_path / "out"
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    seen: list[tuple[int, bool]] = []  # (frames shown, any shard finished yet)
    real_update = tqdm.update

    def update(self, n=1):
        real_update(self, n)
        seen.append((self.n, any(out.glob("shard-*.tar"))))

    def slow_frame(self, *a, **k):  # 24 frames take ~1 s: the parent's 0.2 s polls see them move
        time.sleep(0.04)
        return real_write_frame(self, *a, **k)

    real_write_frame = FrameWriter.write_frame
    monkeypatch.setattr(tqdm, "update", update)
    monkeypatch.setattr(FrameWriter, "write_frame", slow_frame)  # forked workers inherit it
    convert(two_long, out, ConvertConfig(progress=True, workers=min(workers, available_cpus()), decoder="pyav",
                                         shard_size=shard_size))
    assert [n for n, finished in seen if 0 < n < 24 and not finished], seen
    assert seen[-1][0] == 48
    first_draw = term.getvalue().split("\r")[1]
    assert " 0/48 " in first_draw and "reading the first episode" in first_draw, first_draw


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_into_a_log_is_plain_lines(two_long, tmp_path, monkeypatch, capsys):
    """stderr not a terminal (pytest's capture, like `2> log` or CI): no `\r` redraws, a line at the
    start saying what it waits for, one every LINE_EVERY_S seconds (0.2 here) while frames come,
    and one at the end."""
    import datakit.progress

    real_write_frame = FrameWriter.write_frame

    def slow_frame(self, *a, **k):  # 48 frames take ~2 s: about 10 lines at 0.2 s
        time.sleep(0.04)
        return real_write_frame(self, *a, **k)

    monkeypatch.setattr(FrameWriter, "write_frame", slow_frame)
    monkeypatch.setattr(datakit.progress, "LINE_EVERY_S", 0.2)
    t0 = time.monotonic()
    convert(two_long, tmp_path / "out", ConvertConfig(progress=True, workers=1, decoder="pyav"))
    seconds = time.monotonic() - t0
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n")
    lines = err.splitlines()
    assert lines[0] == "convert ds: 0/48 frames (0%), reading the first episode", lines
    assert lines[-1].startswith("convert ds: 48/48 frames (100%), done in "), lines
    counts = [int(line.split(": ")[1].split("/")[0]) for line in lines]
    middle = counts[1:-1]
    # a tick may land after the 48th frame and before the closing line (seen under load): 48 allowed
    assert middle and all(0 < n <= 48 for n in middle) and middle == sorted(middle), lines
    assert all("frames/s, about " in line for line in lines[1:-1]), lines
    assert len(lines) <= seconds / 0.2 + 2, (len(lines), seconds)
