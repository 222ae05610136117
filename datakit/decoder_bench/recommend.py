"""From results to a ranking of backends per codec and access pattern, and the file that
`datakit convert --decoder auto` reads (`datakit.decoders.recommendations_path()`).

Only the main matrix counts (threads=1, decoder reused, one worker: what conversion and a
data-loader worker do by default). A backend's score for a codec and pattern is the geometric
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

from datakit.decoder_bench.runner import is_wrong
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


def _main(rec: dict) -> bool:
    return rec.get("group") == "main"


def rank(records: list[dict]) -> list[Ranking]:
    """One Ranking per (codec, pattern) present in the main matrix."""
    videos: dict[tuple[str, str], set[str]] = defaultdict(set)
    fps: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
    bad: dict[tuple[str, str, str], str] = {}
    for r in filter(_main, records):
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
        backends = sorted({r["decoder"] for r in records if _main(r) and (r["codec"], r["pattern"]) == (codec, pattern)})
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
        usable = [b for b in r.order if b in BACKENDS and b not in r.incomplete]
        if usable:
            rec[r.codec][r.pattern] = usable
    return dict(rec)


def write_recommendations(path: Path, rankings: list[Ranking], machine: dict) -> dict:
    """Merge this run's rankings into the file at `path` (codecs not measured now are kept),
    written atomically so a reader never sees half a file."""
    path = Path(path)
    try:
        old = json.loads(path.read_text())
        merged = dict(old.get("recommendations", {}))
    except (OSError, ValueError):
        merged = {}
    for codec, pats in recommendations(rankings).items():
        merged[codec] = {**merged.get(codec, {}), **pats}
    doc = {
        "recommendations": merged,
        "frames_per_s": {f"{r.codec}/{r.pattern}": {b: round(v, 1) for b, v in r.fps.items()} for r in rankings},
        "machine": machine,
        "written_by": "datakit bench-decoders",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1).encode(), durable=False)
    return doc
