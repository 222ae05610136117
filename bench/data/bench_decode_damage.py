"""How much flipped-byte damage in mp4 frame data each decoder backend reports.

For each codec: a clean 64x128, 30-frame synthetic video; COPIES damaged copies, each with 8
bytes XOR-ed inside one frame's compressed data (`datakit.synth.damage.flip_frame_bytes`).
Per copy: how many frames really differ (a lenient PyAV decode that skips failed packets,
compared with the clean decode, max abs difference > 30 levels) and whether each backend's
full decode through datakit raises. Each backend runs in its own process (their bundled FFmpeg
builds do not mix well).

    python bench/data/bench_decode_damage.py [--copies 40] [--markdown bench/results/decode_damage.md]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BACKENDS = ("pyav", "decord", "torchcodec")
CODECS = ("h264", "av1")
H, W, N = 64, 128, 30


def _lenient(path: Path):
    import av

    out = []
    with av.open(str(path)) as c:
        for pkt in c.demux(video=0):
            try:
                out += [f.to_ndarray(format="rgb24") for f in pkt.decode()]
            except av.FFmpegError:
                pass
    return out


def measure_backend(backend: str, copies: int, work: Path) -> dict:
    """{codec: {"copies", "damaged", "reported", "missed_frames": [...]}} for one backend."""
    import numpy as np

    from datakit.decoders import open_decoder
    from datakit.synth import encode_video, synth_frame
    from datakit.synth.damage import flip_frame_bytes

    result = {}
    for codec in CODECS:
        clean = work / f"{codec}.mp4"
        if not clean.exists():
            encode_video(clean, [synth_frame(i, H, W) for i in range(N)], fps=10, codec=codec)
        ref = _lenient(clean)
        damaged = reported = 0
        missed = []
        for seed in range(copies):
            bad = work / f"{backend}-{codec}-{seed}.mp4"
            flip_frame_bytes(clean, bad, seed=seed)
            got = _lenient(bad)
            n_bad = sum(1 for a, b in zip(ref, got) if np.abs(a.astype(int) - b).max() > 30) + abs(len(ref) - len(got))
            try:
                dec = open_decoder(bad, backend)
                sum(1 for _ in dec.iter_frames(0, N))
                dec.close()
                raised = False
            except Exception:
                raised = True
            damaged += n_bad > 0
            reported += raised
            if n_bad and not raised:
                missed.append(n_bad)
            bad.unlink()
        result[codec] = {"copies": copies, "damaged": damaged, "reported": reported, "missed_frames": missed}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=40)
    ap.add_argument("--backend", help=argparse.SUPPRESS)  # internal: one backend in this process
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    if args.backend:
        print(json.dumps(measure_backend(args.backend, args.copies, Path(args.work))))
        return
    rows = {}
    with tempfile.TemporaryDirectory() as work:
        for b in BACKENDS:
            p = subprocess.run([sys.executable, __file__, "--backend", b, "--copies", str(args.copies), "--work", work],
                               capture_output=True, text=True)
            lines = p.stdout.strip().splitlines()
            rows[b] = json.loads(lines[-1]) if p.returncode == 0 and lines else {"error": p.stderr.strip()[-300:]}
    lines = ["| backend | codec | damaged copies | reported | damaged but decoded quietly | frames wrong in those (median, max) |",
             "|---|---|---|---|---|---|"]
    for b, res in rows.items():
        for codec in CODECS:
            r = res.get(codec)
            if r is None:
                lines.append(f"| {b} | {codec} | error: {res.get('error', '')[:80]} | | | |")
                continue
            m = sorted(r["missed_frames"])
            spread = f"{m[len(m) // 2]}, {m[-1]}" if m else "-"
            lines.append(f"| {b} | {codec} | {r['damaged']}/{r['copies']} | {r['reported']} | {len(m)} | {spread} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(f"# Flipped bytes in frame data: what each decoder reports\n\n"
                                 f"`python bench/data/bench_decode_damage.py --copies {args.copies}`\n\n" + text)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    main()
