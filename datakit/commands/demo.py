"""`datakit demo`: datakit's half of `make demo` in one command. Generate a small LeRobot v3.0
dataset with real AV1 video (LeRobot's encoder settings; moving content; 3 cameras, one all black
as a padded slot; episodes of different lengths), convert it, verify it, read frames back and
compare them with an independent PyAV decode of the source. Exit 0 only when all of that holds.

`make demo` then trains trainkit's `pi05_tiny` for 30 steps from the shards written here
(`DIR/shards`) with `trainkit run`, and fails unless the loss falls (tools/demo_check.py): datakit
never imports trainkit, so the training half is trainkit's own command."""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from datakit.errors import OutputError

if TYPE_CHECKING:
    import numpy as np

DEMO_LENGTHS = (90, 64, 120, 75, 48, 101)
DEMO_MARKER = ".datakit-demo"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="generate a small LeRobot dataset with real AV1 video, convert, verify")
    p.add_argument("--dir", type=Path, default=Path("demo-out"), help="working folder (default demo-out/)")
    return p


def run(args) -> int:
    return run_demo(args.dir)


def _pyav_frame(path: Path, file_frame: int) -> np.ndarray:
    import av

    with av.open(str(path)) as c:
        for i, f in enumerate(c.decode(video=0)):
            if i == file_frame:
                return f.to_ndarray(format="rgb24")
    raise IndexError(file_frame)


def claim_demo_dir(work: Path) -> None:
    """The demo deletes and rewrites what is inside its folder: only a folder it created (it
    holds DEMO_MARKER) or a new/empty one will do, never a user's folder that happens to hold
    `shards/`."""
    work = Path(work)
    if work.exists() and not work.is_dir():
        raise OutputError(work, "demo folder path exists and is not a folder")
    if work.is_dir() and any(work.iterdir()) and not (work / DEMO_MARKER).is_file():
        raise OutputError(work, f"not a folder made by `datakit demo` (no {DEMO_MARKER}); "
                          f"pass a new or empty --dir")
    work.mkdir(parents=True, exist_ok=True)
    (work / DEMO_MARKER).write_text("made by `datakit demo`; its contents are rewritten by each demo run\n")


def run_demo(work: Path) -> int:
    """Generate, convert, verify and read back in `work` (shards in `work/shards`); 0 when every
    check holds, else 1. Imports here: `datakit --help` should not pay for torch and PyAV."""
    import numpy as np
    from rich.console import Console

    from datakit.commands.summary import print_summary
    from datakit.convert import convert
    from datakit.convert.config import ConvertConfig
    from datakit.reader import open_shards
    from datakit.sources import scan
    from datakit.synth import make_lerobot_dataset
    from datakit.verify import verify

    claim_demo_dir(work)
    console = Console()
    src, out = work / "lerobot-v3-av1", work / "shards"
    t = time.perf_counter()
    console.rule("1. generate a LeRobot v3.0 dataset (real AV1 encoding, libsvtav1 crf=30 g=2)")
    if not (src / "meta" / "info.json").exists():
        make_lerobot_dataset(src, version="v3.0", episode_lengths=DEMO_LENGTHS, height=240, width=320, fps=15,
                             codec="av1", v3_episodes_per_file=3)
    console.print(f"{src}: {len(DEMO_LENGTHS)} episodes, {sum(DEMO_LENGTHS)} frames, 3 cameras "
                  f"(observation.images.side is black padding) in {time.perf_counter() - t:.1f} s")
    console.rule("2. datakit convert")
    s = convert(src, out, ConvertConfig(shard_size=8 << 20), force=True)
    print_summary(s.index, s.seconds, console)
    console.rule("3. datakit verify")
    rep = verify(out)
    console.print(f"{'OK' if rep.ok else 'DAMAGED'}: {rep.shards} shards re-hashed, {rep.offsets_checked} offsets checked")
    console.rule("4. random access vs an independent PyAV decode of the source")
    reader, spec = open_shards(out), scan(src)
    rng = np.random.default_rng(0)
    worst = 0
    for _ in range(5):
        ref = spec.episodes[int(rng.integers(len(spec.episodes)))]
        f = int(rng.integers(ref.length))
        vs = ref.videos["observation.images.top"]
        expect = _pyav_frame(vs.path, int(round(vs.from_timestamp * spec.fps)) + f)
        got = reader.read_frame(ref.episode_index, f, "observation.images.top")
        diff = int(np.abs(got.astype(int) - expect.astype(int)).max())
        worst = max(worst, diff)
        console.print(f"episode {ref.episode_index} frame {f}: shape {got.shape}, max |diff| vs PyAV = {diff}")
    ok = rep.ok and worst == 0
    console.print(f"[bold {'green' if ok else 'red'}]datakit demo {'passed' if ok else 'FAILED'}[/] "
                  f"in {time.perf_counter() - t:.1f} s; shards in {out}/ (`make demo` trains on them next)")
    return 0 if ok else 1
