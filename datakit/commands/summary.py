"""Human-readable summaries (rich tables) of a conversion and of an index."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from datakit.shards.index import ShardIndex


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def source_label(fmt: str | None, version: str | None, name: str | None = None) -> str:
    """The source in a few words, each once: "lerobot v2.1 (pusht)", "droid raw". DROID's version is
    "droid-raw" (index.json and the resume fingerprint keep that word) and its folder is often named
    droid too: "droid droid-raw (droid)" said it three times."""
    fmt = fmt or "?"
    words = [fmt, (version or "").removeprefix(f"{fmt}-")]
    label = " ".join(w for w in words if w)
    return label if not name or name.lower() == fmt.lower() else f"{label} ({name})"


def index_table(index: ShardIndex, seconds: float | None = None, title: str = "datakit",
                notes: dict[str, str] | None = None) -> Table:
    t = Table(title=title, show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    total = sum(s.bytes for s in index.shards)
    t.add_row("source", escape(source_label(index.source.get("format"), index.source.get("version"),
                                            index.source.get("name"))))
    t.add_row("episodes", str(index.num_episodes))
    t.add_row("frames", str(index.num_frames))
    t.add_row("shards", str(index.num_shards))
    t.add_row("bytes", _gib(total))
    t.add_row("layout", index.layout)
    if seconds is not None:
        t.add_row("time", f"{seconds:.1f} s ({index.num_frames / max(seconds, 1e-9):.0f} frames/s)")
    t.add_row("skipped episodes", str(len(index.skipped)))
    for what, text in (notes or {}).items():  # how the run was made: decoder, workers, and why
        if text:
            t.add_row(what, escape(text))
    return t


def camera_table(index: ShardIndex) -> Table:
    """One row per camera. Names are never cut: the prefix every camera shares (LeRobot's
    "observation.images.") moves into the title, and a name still too long for the terminal wraps
    (DROID's "observation.images.exterior_image_1_left" was cut to "observation.images.exterior_i…"
    in an 80-column log)."""
    names = list(index.cameras)
    prefix = _shared_prefix(names)
    t = Table(title=f"cameras ({escape(prefix)}*)" if prefix else "cameras")
    t.add_column("camera", overflow="fold", min_width=min(max(map(len, names), default=6) - len(prefix), 30))
    for col in ("size", "status", "real", "blank", "missing"):
        t.add_column(col, no_wrap=True)
    for name, c in index.cameras.items():
        style = {"real": "green", "blank": "yellow", "missing": "red"}.get(c.status, "")
        t.add_row(escape(name[len(prefix):]), f"{c.height}x{c.width}", f"[{style}]{c.status}[/{style}]",
                  *(str(c.episodes.get(k, 0)) for k in ("real", "blank", "missing")))
    return t


def _shared_prefix(names: list[str]) -> str:
    """The dotted prefix all of several camera names share ("observation.images."), "" for one name."""
    if len(names) < 2:
        return ""
    parts = [n.split(".") for n in names]
    shared = []
    for words in zip(*(p[:-1] for p in parts)):
        if len(set(words)) != 1:
            break
        shared.append(words[0])
    return ".".join(shared) + "." if shared else ""


def skipped_table(index: ShardIndex) -> Table:
    t = Table(title="skipped episodes")
    t.add_column("episode")
    t.add_column("reason")
    for s in index.skipped:
        t.add_row(str(s["episode_index"]), escape(str(s["reason"])))  # paths may hold [brackets]
    return t


def print_summary(index: ShardIndex, seconds: float | None = None, console: Console | None = None,
                  notes: dict[str, str] | None = None) -> None:
    console = console or Console()
    console.print(index_table(index, seconds, notes=notes))
    console.print(camera_table(index))
    if index.skipped:
        console.print(skipped_table(index))
