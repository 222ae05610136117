"""From results to a ranking of backends per codec, and the file that `datakit convert
--decoder auto` reads (`datakit.decoders.recommendations_path()`).

Two rankings, for two shapes of work, stored under their own keys with what each measured:
- "recommendations" (per codec and access pattern): the main matrix (threads=1, decoder opened
  once and reused, warm, one worker): decode alone, what a data-loader worker does.
- "conversion" (per codec): conversion-shaped records only: the whole file in order, the
  decoder opened inside the timing (reuse=False), 1 thread, one worker, as convert opens one
  decoder per camera and episode. Scored per core: frames/s divided by the cores the decoder
  kept busy (at least 1), since convert's workers fill every core. Only this one is used by
  `--decoder auto`: a decode-only ranking put Decord first on 2 cores, where it converted 2.2x
  slower than PyAV.

A backend's score for a codec and pattern is the geometric
mean of its frames/s over that codec's videos (those every ranked backend has a result for, so
a run cut short still compares like with like), so one small video does not outweigh a large
one. A backend that failed or returned a wrong frame on any of those videos ranks after every
backend that read them correctly: skipping the hard file must not make it look fast.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from datakit.commands.bench_decoders.runner import is_wrong
from datakit.durable import write_atomic
from datakit.decoders import BACKENDS


@dataclass(frozen=True)
class Ranking:
    codec: str
    pattern: str
    order: list[str]  # fastest first; complete backends before incomplete ones
    fps: dict[str, float]  # geometric-mean frames/s of each ranked backend
    incomplete: dict[str, str]  # backend -> why it does not count as reading every video

    def line(self) -> str:
        parts = []
        for b in self.order:
            note = " (incomplete: " + self.incomplete[b] + ")" if b in self.incomplete else ""
            parts.append(f"{b} {self.fps[b]:.0f} f/s{note}" if b in self.fps else f"{b}{note}")
        best = self.order[0] if self.order and self.order[0] not in self.incomplete else "none"
        return f"{self.codec} {self.pattern}: use {best}  [" + " > ".join(parts) + "]"


DECODE_SHAPE = "main matrix: decoder opened once and reused, warm, 1 thread, 1 worker (decode alone)"
CONVERSION_SHAPE = ("sequential, decoder opened per file inside the timing, 1 thread, 1 worker; "
                    "frames/s per busy core")
CONVERSION = "conversion"  # the pattern name of conversion-shaped rankings


def _main(rec: dict) -> bool:
    return rec.get("group") == "main"


def conversion_shaped(rec: dict) -> bool:
    """A record that measured what convert does with one decoder: open, every frame in order, close."""
    return (rec.get("pattern") == "sequential" and rec.get("reuse") is False and rec.get("threads") == 1
            and rec.get("workers", 1) == 1)


def _per_core(rec: dict) -> float | None:
    fps = rec.get("frames_per_s")
    return float(fps) / max(1.0, float(rec.get("cpu_util") or 1.0)) if fps else None


def conversion_records(records: list[dict]) -> list[dict]:
    """Conversion-shaped records, re-labelled as one "conversion" pattern of the main matrix,
    their frames/s per busy core, so that `rank` ranks them like any other pattern."""
    return [{**r, "group": "main", "pattern": CONVERSION, "frames_per_s": _per_core(r)}
            for r in records if conversion_shaped(r)]


def rank(records: list[dict]) -> list[Ranking]:
    """One Ranking per (codec, pattern) present in the main matrix, and one per codec with
    conversion-shaped records (pattern "conversion")."""
    shaped = [r for r in records if _main(r)] + conversion_records(records)
    videos: dict[tuple[str, str], set[str]] = defaultdict(set)
    fps: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    bad: dict[tuple[str, str, str], str] = {}
    for r in shaped:
        key = (r["codec"], r["pattern"])
        videos[key].add(r["video"])
        k3 = (*key, r["decoder"])
        if r.get("error"):
            bad.setdefault(k3, r["error"].split(":")[0] + " on " + r["video"])
        elif is_wrong(r):
            bad.setdefault(k3, "wrong frames on " + r["video"])
        elif r.get("frames_per_s"):
            fps[k3][r["video"]] = float(r["frames_per_s"])
    out = []
    for codec, pattern in sorted(videos):
        backends = sorted({r["decoder"] for r in shaped if (r["codec"], r["pattern"]) == (codec, pattern)})
        incomplete = {b: bad[(codec, pattern, b)] for b in backends if (codec, pattern, b) in bad}
        good = [b for b in backends if b not in incomplete]
        # compare on the videos every good backend has a result for (a run cut short leaves gaps)
        common = set.intersection(*(set(fps[(codec, pattern, b)]) for b in good)) if good else set()
        score = {}
        for b in backends:
            got = fps.get((codec, pattern, b), {})
            vals = [got[v] for v in sorted(common)] if b in good and common else list(got.values())
            if vals:
                score[b] = math.exp(sum(math.log(v) for v in vals) / len(vals))
        order = sorted(backends, key=lambda b: (b in incomplete, -score.get(b, 0.0)))
        out.append(Ranking(codec, pattern, order, score, incomplete))
    return out


def recommendations(rankings: list[Ranking]) -> dict[str, dict[str, list[str]]]:
    """{codec: {pattern: [backend, ...]}} with the backends `open_decoder` knows, complete
    ones only (the registry appends its default order after them for fallback)."""
    rec: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for r in rankings:
        if r.pattern == CONVERSION:
            continue
        usable = [b for b in r.order if b in BACKENDS and b not in r.incomplete]
        if usable:
            rec[r.codec][r.pattern] = usable
    return dict(rec)


def conversion(rankings: list[Ranking]) -> dict[str, list[str]]:
    """{codec: [backend, ...]} from the conversion-shaped rankings, complete backends only."""
    out = {}
    for r in rankings:
        usable = [b for b in r.order if b in BACKENDS and b not in r.incomplete]
        if r.pattern == CONVERSION and usable:
            out[r.codec] = usable
    return out


def write_recommendations(path: Path, rankings: list[Ranking], machine: dict) -> dict:
    """Merge this run's rankings into the file at `path` (codecs not measured now are kept),
    written atomically so a reader never sees half a file."""
    path = Path(path)
    try:
        old = json.loads(path.read_text())
        merged = dict(old.get("recommendations", {}))
        merged_conv = dict(old.get(CONVERSION, {}))
    except (OSError, ValueError, AttributeError, TypeError):
        merged, merged_conv = {}, {}
    for codec, pats in recommendations(rankings).items():
        merged[codec] = {**merged.get(codec, {}), **pats}
    merged_conv.update(conversion(rankings))
    doc = {
        "recommendations": merged,
        CONVERSION: merged_conv,
        "measured": {"recommendations": DECODE_SHAPE, CONVERSION: CONVERSION_SHAPE},
        "frames_per_s": {f"{r.codec}/{r.pattern}": {b: round(v, 1) for b, v in r.fps.items()} for r in rankings},
        "machine": machine,
        "written_by": "datakit bench-decoders",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1).encode(), durable=False)
    return doc
