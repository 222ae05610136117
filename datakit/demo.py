"""`datakit demo` / `make demo`: the whole product in one command. Generate a small LeRobot v3.0
dataset with real AV1 video (LeRobot's encoder settings; moving content; 3 cameras, one all black
as a padded slot; episodes of different lengths), convert it, verify it, read frames back and
compare them with an independent PyAV decode of the source, then train trainkit's `pi05_tiny`
for 30 steps from the shards just written (the loss falls, the end-of-run summary table): on the
CPU, 2.8 s more than the demo without it on a 2-core box (19.3 s in all, 2026-12-01)."""
from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from datakit.convert.config import ConvertConfig
from datakit.convert import convert
from datakit.errors import OutputError
from datakit.reader import open_shards
from datakit.summary import print_summary
from datakit.verify import verify

DEMO_LENGTHS = (90, 64, 120, 75, 48, 101)
DEMO_MARKER = ".datakit-demo"
TRAIN_STEPS = 30
LOSS_WINDOW = 5  # steps averaged at each end to say whether the loss fell


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


def train_tiny(shards: Path, out: Path, steps: int = TRAIN_STEPS) -> Any:
    """`trainkit run trainkit/configs/pi05_tiny.toml` on `shards` for `steps` steps, one process, into
    `out` (replaced): its loss lines and summary table print as the command prints them. Returns
    trainkit's RunResult. The preset's own learning rate and schedule: its loss falls from about
    1.05 to 0.7 in 30 steps on the demo's data."""
    import torch.distributed as dist

    from trainkit.config import load_config
    from trainkit.train import run

    tiny = Path(__file__).resolve().parents[1] / "trainkit" / "configs" / "pi05_tiny.toml"
    shutil.rmtree(out, ignore_errors=True)  # metrics.jsonl appends: a rerun starts a fresh run
    cfg = load_config(tiny, [f"data.shards={shards}", f"output.dir={out}", f"train.steps={steps}",
                             "output.log_every=5", "output.progress=false", "output.resume=false",
                             "data.num_workers=0"])
    try:
        with warnings.catch_warnings():  # FSDP2 on a one-process CPU mesh says this once per run
            warnings.filterwarnings("ignore", message="DTensor random operators")
            return run(cfg)
    finally:
        if dist.is_initialized():  # the one-process group the run made
            dist.destroy_process_group()


def loss_fell(losses: dict[int, float]) -> tuple[float, float]:
    """(mean loss of the first LOSS_WINDOW steps, of the last LOSS_WINDOW steps)."""
    ordered = [losses[s] for s in sorted(losses)]
    return sum(ordered[:LOSS_WINDOW]) / LOSS_WINDOW, sum(ordered[-LOSS_WINDOW:]) / LOSS_WINDOW


def run_demo(work: Path) -> int:
    from datakit.sources import scan
    from datakit.synth import make_lerobot_dataset

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
    console.rule(f"5. trainkit run pi05_tiny: {TRAIN_STEPS} steps from these shards")
    runs = work / "train"
    console.print(f"trainkit run trainkit/configs/pi05_tiny.toml --set data.shards={out} --set output.dir={runs} "
                  f"--set train.steps={TRAIN_STEPS}", highlight=False, markup=False)
    result = train_tiny(out, runs)
    first, last = loss_fell(result.losses)
    fell = last < first
    console.print(f"loss, mean of the first {LOSS_WINDOW} steps -> the last {LOSS_WINDOW}: {first:.4f} -> {last:.4f} "
                  f"({'falling' if fell else 'NOT falling'}); summary in {runs / 'summary.json'}", highlight=False)
    ok = rep.ok and worst == 0 and fell
    console.print(f"[bold {'green' if ok else 'red'}]demo {'passed' if ok else 'FAILED'}[/] "
                  f"in {time.perf_counter() - t:.1f} s; shards in {out}/")
    return 0 if ok else 1
