"""Runs a `Job` in fresh worker processes and turns what they report into one result record.

A crash, a hang or a missing backend becomes a record with `error` set: the benchmark as a
whole never dies with one decoder. For a worker sweep (workers > 1) all workers warm up first
and start timing together; a repeat's wall time is the slowest worker's, its frames the sum,
so frames/s is the throughput of the whole pool and cpu_util the cores it kept busy.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from datakit.commands.bench_decoders.measure import Job, summarize

# run as a script, not `-m`, so the worker can skip datakit/__init__ (see worker._light_package)
WORKER = [sys.executable, str(Path(__file__).with_name("worker.py"))]
RECORD_FIELDS = (
    "decoder", "version", "video", "codec", "gop", "height", "width", "pattern", "group", "threads",
    "seek_mode", "reuse", "workers", "frames", "repeats", "wall_s_median", "wall_s_min", "wall_s_max",
    "frames_per_s", "cpu_ms_per_frame", "cpu_util", "peak_rss_mb", "first_frame_ms", "frames_checked",
    "frames_correct", "check", "wrong_examples", "psnr_db", "error",
)


def _env() -> dict:
    """The worker imports the same datakit (and test helpers) as this process."""
    env = dict(os.environ)
    paths = [p for p in sys.path if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("SVT_LOG", "1")
    return env


class _Worker:
    def __init__(self, request: dict):
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True, env=_env())
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        self.result: dict | None = None

    def wait_for(self, *words: str) -> str | None:
        """Read stdout until a line starting with one of `words`; None on end of output."""
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                self.result = json.loads(line[7:])
                return "RESULT"
            if line.strip() in words:
                return line.strip()
        return None

    def go(self) -> None:
        try:
            self.proc.stdin.write("GO\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    def failure(self) -> str:
        """Why no result came: the signal or exit code, and the end of stderr."""
        rc = self.proc.wait()
        self.err.seek(0)
        tail = self.err.read().decode(errors="replace").strip().splitlines()[-3:]
        if rc < 0:
            why = f"crashed ({signal.Signals(-rc).name})"
        else:
            why = f"worker exited with code {rc} and no result"
        return why + (": " + " | ".join(tail) if tail else "")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def probe_backend(backend: str, timeout: float = 120.0) -> tuple[str | None, str | None]:
    """(version, None) when the backend loads in a fresh process, else (None, error)."""
    w = _Worker({"probe": backend})
    timer = threading.Timer(timeout, w.kill)
    timer.start()
    try:
        w.wait_for()
    finally:
        timer.cancel()
        w.kill()
    if w.result is None:
        return None, w.failure()
    return w.result.get("version"), w.result.get("error")


def _run_workers(job: Job, timeout: float) -> tuple[list[dict], str | None]:
    base = job.to_json()
    workers = []
    for k in range(job.setting.workers):
        req = dict(base, seed=job.seed + 7919 * k, probe_out=job.probe_out if k == 0 else None)
        workers.append(_Worker(req))
    timed_out = threading.Event()

    def expire() -> None:
        timed_out.set()
        for w in workers:
            w.kill()

    timer = threading.Timer(timeout, expire)
    timer.start()
    try:
        states = [w.wait_for("READY") for w in workers]
        if all(s == "READY" for s in states):
            for w in workers:
                w.go()
            for w in workers:
                w.wait_for()
    finally:
        timer.cancel()
        for w in workers:
            w.proc.stdin.close()
            w.proc.wait()
    if timed_out.is_set():
        return [], f"timeout after {timeout:.0f} s"
    results = [w.result for w in workers if w.result is not None]
    if len(results) < len(workers):
        bad = next(w for w in workers if w.result is None)
        errs = [r["error"] for r in results if "error" in r]
        return [], errs[0] if errs else bad.failure()
    errs = [r["error"] for r in results if "error" in r]
    return results, errs[0] if errs else None


def base_record(job: Job) -> dict:
    v = job.video
    tc = job.backend.startswith("torchcodec")
    rec = dict.fromkeys(RECORD_FIELDS)
    rec.update(decoder=job.backend, video=v.label, codec=v.codec, gop=v.gop, height=v.height, width=v.width,
               pattern=job.pattern, group=job.group, threads=job.setting.threads,
               seek_mode=job.setting.seek_mode if tc else None, reuse=job.setting.reuse,
               workers=job.setting.workers)
    return rec


def error_record(job: Job, error: str, version: str | None = None) -> dict:
    rec = base_record(job)
    rec.update(error=error, version=version)
    return rec


def run_job(job: Job, timeout: float = 300.0) -> dict:
    """Measure `job` in `job.setting.workers` fresh processes; one record, `error` set on failure."""
    results, error = _run_workers(job, timeout)
    if error or not results:
        return error_record(job, error or "no result")
    rec = base_record(job)
    n = min(len(r["walls"]) for r in results)
    walls = [max(r["walls"][i] for r in results) for i in range(n)]
    cpus = [sum(r["cpus"][i] for r in results) for i in range(n)]
    frames = [sum(r["frames"][i] for r in results) for i in range(n)]
    rec.update(summarize(walls, cpus, frames))
    checked = sum(r["frames_checked"] for r in results)
    rec.update(
        version=results[0].get("version"),
        peak_rss_mb=max(r["peak_rss_mb"] for r in results),
        first_frame_ms=round(statistics.median(r["first_frame_ms"] for r in results), 2),
        frames_checked=checked,
        frames_correct=sum(r["frames_correct"] for r in results),
        check=results[0]["check"],
        wrong_examples=[e for r in results for e in r["wrong_examples"]][:5],
    )
    return rec


def is_wrong(rec: dict) -> bool:
    """A record whose decoder returned frames other than the ones asked for."""
    c = rec.get("frames_correct")
    return rec.get("error") is None and c is not None and c != rec.get("frames_checked")


def probe_path(folder: Path, backend: str, label: str) -> Path:
    return Path(folder) / f"{backend.replace(':', '_')}--{label}.npz"
