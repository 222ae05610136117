"""`datakit bench-decoders`: which video decoder to use, measured on this machine the way
training reads video, and remembered for `datakit convert --decoder auto`.

    datakit bench-decoders --quick                       # < 2 min on 2 cores
    datakit bench-decoders --json r.json --markdown r.md --plot r.png
    datakit bench-decoders --video data/lerobot_ds --patterns sequential,single

Every measurement runs in its own process (see worker.py); a backend that is missing, cannot
read a codec, crashes or returns wrong frames is reported, never skipped. Exit code 1 when any
decoder returned a wrong frame.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from datakit.durable import write_atomic
from datakit.machine import available_cpus
from datakit.commands.bench_decoders import crosscheck, matrix, recommend, report, runner, videos
from datakit.commands.bench_decoders.patterns import PATTERNS

SCHEMA = "datakit.bench-decoders/1"

QUICK = dict(sizes="180x320", codecs="h264,av1", frames=90, repeats=3, max_s=1.0, thread_sweep="", workers="2")
THOROUGH = dict(sizes=",".join(videos.SIZES), codecs=",".join(videos.CODECS), frames=300, repeats=5, max_s=4.0,
                thread_sweep="0,2,4", workers=None)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def default_backends() -> str:
    gpu = os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None
    return "pyav,decord,torchcodec" + (",torchcodec-cuda" if gpu else "")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench-decoders", help="benchmark PyAV / Decord / TorchCodec on training access patterns",
        description="Measure video decoders (PyAV, Decord, TorchCodec CPU, TorchCodec CUDA when present) on "
                    "generated or your own videos with the access patterns trainers use (sequential, clips, "
                    "strided, single frames, multi-view), check every decoded frame, and write a per-codec "
                    "ranking that `datakit convert --decoder auto` uses.",
        epilog="Generated videos carry their frame number in the pixels, so a decoder returning the wrong frame "
               "is caught (exit code 1). Patterns: " + "; ".join(f"{k}: {v.doc}" for k, v in PATTERNS.items()),
)
    p.add_argument("--video", type=Path, nargs="+", metavar="PATH",
                   help="video files or LeRobot/DROID dataset folders to sample (default: generated videos)")
    p.add_argument("--max-videos", type=int, default=6, help="videos sampled per dataset folder (default %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help="small run, under 2 minutes on 2 cores: 180x320 H.264 and AV1, 90 frames, 3 repeats, "
                        "no thread sweep, workers 1 and 2")
    p.add_argument("--sizes", help=f"generated video sizes, from {','.join(videos.SIZES)} (default: all; quick: 180x320)")
    p.add_argument("--codecs", help=f"generated codec settings, from {','.join(videos.CODECS)} (default: all)")
    p.add_argument("--frames", type=int, help="frames per generated video (default 300; quick 90)")
    p.add_argument("--videos-dir", type=Path, default=Path.home() / ".cache" / "datakit" / "bench-videos",
                   help="where generated videos are cached between runs (default %(default)s)")
    p.add_argument("--backends", default=None,
                   help="comma list of pyav, decord, torchcodec, torchcodec-cuda or package.module:opener "
                        "(default: the three CPU ones, plus torchcodec-cuda when an NVIDIA GPU is present)")
    p.add_argument("--patterns", default=",".join(PATTERNS), help="comma list of access patterns (default %(default)s)")
    p.add_argument("--thread-sweep", help="decoder thread counts tried besides 1, 0 = library's choice "
                                          "(default 0,2,4; quick: none)")
    p.add_argument("--seek-modes", default="approximate", help="TorchCodec seek modes tried besides exact (default %(default)s)")
    p.add_argument("--no-reopen", action="store_true", help="skip the decoder-reopened-per-sample measurements")
    p.add_argument("--workers", help="worker-process counts for the sweep (default 1,2,4..cores; quick: 2)")
    p.add_argument("--sweep-video", default="auto",
                   help="video label for the setting sweeps, 'auto' (AV1 near 480p, the default) or 'none'")
    p.add_argument("--repeats", type=int, help="timed repeats per measurement, warm-up excluded (default 5)")
    p.add_argument("--max-job-s", type=float, help="decode seconds after which a measurement stops repeating "
                                                   "(at least 2 repeats; default 4, quick 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a hung measurement is killed (default %(default)s)")
    p.add_argument("--json", type=Path, help="write all records as JSON")
    p.add_argument("--markdown", type=Path, help="write a Markdown summary")
    p.add_argument("--plot", type=Path, help="write a PNG plot")
    p.add_argument("--recommend-out", type=Path,
                   help="where to write the ranking convert uses (default: datakit.decoders.recommendations_path())")
    p.add_argument("--no-recommend", action="store_true", help="do not write the ranking file")
    p.add_argument("--no-live", action="store_true", help="one line per result instead of a live table")
    p.add_argument("--from-json", type=Path, metavar="FILE",
                   help="measure nothing: re-render tables, --markdown and --plot from a saved --json file "
                        "(also a partial one); writes the ranking only with --recommend-out")
    return p


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                   if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cores = available_cpus()
    return {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu,
            "cores": cores, "platform": platform.platform(), "python": platform.python_version(),
            "load_avg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def _resolve(args) -> dict:
    base = QUICK if args.quick else THOROUGH
    pick = lambda name, attr=None: v if (v := getattr(args, attr or name)) is not None else base[name]  # noqa: E731
    return dict(sizes=pick("sizes"), codecs=pick("codecs"), frames=pick("frames"), repeats=pick("repeats"),
                max_s=pick("max_s", "max_job_s"), thread_sweep=pick("thread_sweep"), workers=pick("workers"))


def _videos(args, opts, say) -> list[videos.BenchVideo]:
    if args.video:
        return videos.collect(args.video, args.max_videos)
    specs = videos.default_specs(_names(opts["sizes"]), _names(opts["codecs"]), opts["frames"])
    return videos.generate_all(specs, args.videos_dir, lambda name: say(f"video {name}"))


@dataclasses.dataclass
class Results:
    """Everything one run produced: what the reports and the JSON file are made from."""

    records: list[dict]
    machine: dict
    backends: dict[str, dict]  # name -> {"version", "error"}
    videos: list[dict]
    crosscheck: list[dict]
    command: str
    partial: bool = False  # the run stopped before every planned measurement was made


def _measure(args, console) -> Results:
    from rich.live import Live

    opts = _resolve(args)
    machine = machine_info()
    backends = _names(args.backends or default_backends())
    cfg = matrix.MatrixConfig(backends=backends, patterns=tuple(PATTERNS[p].name for p in _names(args.patterns)),
                              thread_sweep=_ints(opts["thread_sweep"]), seek_modes=_names(args.seek_modes),
                              reopen=not args.no_reopen,
                              workers=_ints(opts["workers"]) if opts["workers"] else matrix.default_workers(),
                              sweep_video=args.sweep_video, repeats=opts["repeats"], max_s=opts["max_s"])
    with console.status("preparing videos") as st:
        vids = _videos(args, opts, lambda m: st.update(m))
        if not vids:
            raise ValueError("no videos to benchmark")
        probes = {}
        for b in backends:
            st.update(f"loading {b}")
            probes[b] = runner.probe_backend(b)
    for b, (ver, err) in probes.items():
        console.print(f"{b}: " + (f"[green]{ver}[/]" if ver else f"[yellow]unavailable[/] ({err})"))
    argv = sys.argv[sys.argv.index("bench-decoders") + 1:] if "bench-decoders" in sys.argv else []
    res = Results([], machine, {b: {"version": v, "error": e} for b, (v, e) in probes.items()},
                  [{"label": v.label, "path": str(v.path), "codec": v.codec, "height": v.height, "width": v.width,
                    "frames": v.num_frames, "gop": v.gop, "numbered": v.numbered} for v in vids],
                  [], " ".join(["datakit bench-decoders", *map(shlex.quote, argv)]), partial=True)
    jobs = matrix.build(vids, cfg)
    probe_dir = Path(tempfile.mkdtemp(prefix="bench-decoders-"))
    probe_files: dict[tuple[str, str], Path] = {}
    live = None if args.no_live or not console.is_terminal else Live(console=console, refresh_per_second=4)
    try:
        if live:
            live.start()
        for i, job in enumerate(jobs):
            ver, err = probes[job.backend]
            name = f"{job.backend} {job.video.label} {job.pattern} [{job.group}]"
            if live:
                live.update(report.live_view(res.records, i, len(jobs), name))
            if ver is None:
                rec = runner.error_record(job, err if err.startswith("unavailable") else f"unavailable: {err}")
            else:
                if job.group == "main" and job.pattern == "sequential":
                    path = runner.probe_path(probe_dir, job.backend, job.video.label)
                    job = dataclasses.replace(job, probe_out=str(path))
                    probe_files[(job.video.label, job.backend)] = path
                rec = runner.run_job(job, timeout=args.timeout)
            res.records.append(rec)
            if args.json:  # a run cut short (time limit, Ctrl-C) still leaves what it measured
                _write_json(args.json, _doc(res, []))
            if not live:
                out = f"{rec['error']}" if rec.get("error") else report.cell(rec) + " f/s"
                console.print(f"[{i + 1}/{len(jobs)}] {name} {report.setting_label(rec)}: {out}",
                              highlight=False, markup=False)
        if live:
            live.update(report.live_view(res.records, len(jobs), len(jobs), "done"))
    finally:
        if live:
            live.stop()
    res.crosscheck = crosscheck.compare(probe_files)
    shutil.rmtree(probe_dir, ignore_errors=True)
    for c in res.crosscheck:
        for r in res.records:
            if (r["group"], r["pattern"], r["video"], r["decoder"]) == ("main", "sequential", c["video"], c["decoder"]):
                r["psnr_db"] = c["psnr_db"]  # None with identical=True in crosscheck: bit-identical frames
    res.partial = False
    return res


def _load(path: Path) -> Results:
    """A saved --json file (also a partial one) back into Results, to re-render its reports."""
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a bench-decoders JSON file (schema {doc.get('schema')!r})")
    records = doc["records"]
    backends = doc.get("backends") or {
        d: {"version": next((r["version"] for r in records if r["decoder"] == d and r.get("version")), None),
            "error": None} for d in dict.fromkeys(r["decoder"] for r in records)}
    return Results(records, doc.get("machine", {}), backends, doc.get("videos", []), doc.get("crosscheck", []),
                   doc.get("command", "(unknown)"), partial=bool(doc.get("partial")))


def _doc(res: Results, rankings: list) -> dict:
    return {"schema": SCHEMA, "partial": res.partial, "command": res.command, "machine": res.machine,
            "backends": res.backends, "videos": res.videos, "records": res.records, "crosscheck": res.crosscheck,
            "recommendations": recommend.recommendations(rankings), "rankings": [r.line() for r in rankings]}


def _write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, allow_nan=False).encode(), durable=False)


def run(args) -> int:
    from rich.console import Console

    from datakit.decoders import recommendations_path

    console = Console()
    if not console.is_terminal:  # logs and CI: wide enough that tables do not wrap every cell
        console = Console(width=200)
    res = _load(args.from_json) if args.from_json else _measure(args, console)
    records = res.records
    rankings = recommend.rank(records)
    console.print(report.main_table(records))
    if (t := report.sweep_table(records)) is not None:
        console.print(t)
    for p in report.problems(records):
        console.print(p, style="bold red" if p.startswith("WRONG") else "yellow", highlight=False, markup=False)
    for c in res.crosscheck:
        if c["disagree"]:
            console.print(f"[yellow]{c['decoder']} and {c['reference']} disagree on {c['video']}: "
                          f"{c['psnr_db']} dB PSNR[/]")
    console.print("[bold]Recommendation[/]")
    for r in rankings:
        console.print("  " + r.line(), highlight=False, markup=False)
    # a re-rendered file only updates convert's ranking when asked to, with --recommend-out
    if not args.no_recommend and (args.recommend_out or not args.from_json):
        out = args.recommend_out or recommendations_path()
        recommend.write_recommendations(out, rankings, res.machine)
        console.print(f"wrote {out} (used by convert --decoder auto)")
    if args.json:
        _write_json(args.json, _doc(res, rankings))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(report.markdown(records, rankings, res.machine, res.command, res.crosscheck,
                                                 partial=res.partial, backends=res.backends))
    if args.plot:
        from datakit.commands.bench_decoders.plot import plot

        plot(records, args.plot, title=f"bench-decoders, {res.machine.get('cores')} cores, {res.machine.get('date')}")
    wrong = [r for r in records if runner.is_wrong(r)]
    if wrong:
        console.print(f"[bold red]{len(wrong)} measurement(s) returned WRONG FRAMES[/]: see above")
    return 1 if wrong else 0
