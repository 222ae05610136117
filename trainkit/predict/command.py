"""`trainkit predict`: one function from the command's arguments to the table and the files.

    predict(PredictArgs(source="runs/pi05", shards="out/shards"))   # -> (predict.json's body, out folder)

Order: open the model (nothing is written yet) -> open --shards and check it against the model
(slots, statistics, episodes) -> sample every chunk -> write predict.json and predict.png under
temporary names -> print the table. A bad input stops before the sampling, with one line. A run
trained on a mixture predicts on one of its datasets (known by checksums), with that source's slots,
prompt and statistics.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainkit.data import read_run_shards
from trainkit.errors import DataError, LaunchError
from trainkit.predict.chunks import parse_episodes, predict_episodes
from trainkit.predict.report import plot, report, write_json
from trainkit.predict.source import Source, mixture_source, open_source, same_dataset, training_stats
from trainkit.validation import holdout

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(kw_only=True)
class PredictArgs:
    source: str  # a run folder, or a checkpoint folder (model.safetensors + config.json)
    shards: str  # the datakit shard folder (or URL) to predict on
    episodes: str | None = None  # "3,5,8-11"; None: the run's validation episodes, else every episode
    out: str | None = None  # folder for predict.json / predict.png; None: runs/predict-<source name>
    config: str | None = None  # a checkpoint folder's run config (family, preset, data settings)
    overrides: list[str] = field(default_factory=list)  # --set key=value on top of --config
    weights: str = "model"  # "model" or "ema" (a run with train.ema_decay > 0)
    seed: int = 0  # flow noise: a function of (seed, frame-table row)
    steps: int | None = None  # Euler steps; None: the family's (Pi0.5 10, GR00T 4, DreamZero 16)
    every: int | None = None  # a chunk every N frames, its first N actions kept; None: the horizon
    batch_size: int = 8
    device: str | None = None  # None: cuda when available, else cpu
    dtype: str = "float32"


def predict(args: PredictArgs) -> tuple[dict[str, Any], list[Path]]:
    """Run `trainkit predict` (module docstring); returns predict.json's body and the files written."""
    if args.batch_size < 1 or (args.steps is not None and args.steps < 1) or args.seed < 0:
        raise LaunchError(f"--batch-size and --steps must be >= 1 and --seed >= 0, got {args.batch_size}, "
                          f"{args.steps}, {args.seed}")
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    except RuntimeError:
        raise LaunchError(f"--device {args.device!r}: not a torch device (cuda, cuda:1, cpu)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LaunchError(f"--device {args.device}: no CUDA device here")
    src = open_source(args.source, weights=args.weights, config=args.config, overrides=args.overrides)
    if src.fam.sampler is None:
        raise LaunchError(f"family {src.fam.name!r} has no action sampler (Family.sampler)")
    data, prompt = src.cfg.data, None
    if data.sources:  # a mixture's run predicts on one of its datasets, with that source's slots and prompt
        mine = mixture_source(src, Path(args.shards))
        if mine is None:
            raise DataError(str(args.shards), "none of the datasets of the run's mixture (their checksums.json "
                            f"differ from {', '.join(s.shards for s in data.sources)}): predict on one of them, "
                            "whose statistics the run trained with")
        data, prompt = dataclasses.replace(data, sources=[], slots=mine.slots or data.slots), mine.prompt
    dcfg = dataclasses.replace(data, shards=str(args.shards), num_workers=0)
    shards = read_run_shards(dcfg, src.fam.max_slots(src.model.cfg))
    try:
        if prompt:  # every task text of the source, as the loader gave it in training
            shards.index = dataclasses.replace(shards.index, tasks=[prompt] * len(shards.index.tasks))
        index, stats_from = training_stats(src, shards.index, shards.folder)
        shards = dataclasses.replace(shards, index=index)
        episodes, chosen_by, trained_on = _episodes(args, src, shards)
        steps = args.steps or src.fam.sampler.steps
        done = predict_episodes(src.model, src.fam, dcfg, shards, episodes, every=args.every,
                                batch_size=args.batch_size, seed=args.seed, steps=steps, device=device,
                                dtype=DTYPES[args.dtype])
    finally:
        shards.close()
    found, every = done.episodes, done.every
    chunks = sum(-(-len(e.predicted) // every) for e in found)
    header = {"source": str(args.source), "checkpoint": str(src.path), "step": src.step, "weights": args.weights,
              "family": src.fam.name, "preset": src.cfg.model.preset, "shards": str(args.shards),
              "norm": src.cfg.data.norm, "stats_from": stats_from, "units": "unnormalised",
              "episodes_from": chosen_by, "trained_on": list(trained_on), "seed": args.seed, "steps": steps,
              "horizon": done.horizon, "every": every, "chunks": chunks, "device": str(device),
              "dtype": args.dtype, "seconds": round(done.seconds, 3), "action_names": list(shards.index.action_names)}
    body = report(found, header)
    out = Path(args.out or f"runs/predict-{Path(args.source).resolve().name}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LaunchError(f"--out {out}: cannot create ({e.strerror or e})") from None
    write_json(out / "predict.json", body)
    written = [out / "predict.json"]
    title = (f"{src.fam.name} {src.path.name} ({args.weights} weights): {steps} sampling steps, a chunk every "
             f"{every} frames; recorded (black) vs predicted (dashed)")
    if plot(out / "predict.png", found, body["action_names"], every, title):
        written.append(out / "predict.png")
    else:
        (out / "predict.png").unlink(missing_ok=True)  # an earlier run's plot would not match this JSON
        print("trainkit: predict.png left out: matplotlib is not installed", file=sys.stderr)
    if trained_on:
        print(f"trainkit: episodes {list(trained_on)[:8]} were trained on: their error is not a held-out one",
              file=sys.stderr)
    return body, written


def _episodes(args: PredictArgs, src: Source, shards) -> tuple[tuple[int, ...], str, tuple[int, ...]]:
    """(episodes to predict, how they were chosen, those of them the run trained on)."""
    index, where = shards.index, str(args.shards)
    ours = same_dataset(src, shards.folder)
    # a mixture's source: its own holdout (its val_episodes, or data.val_fraction of its episodes)
    source = mixture_source(src, shards.folder) if ours and src.cfg.data.sources else None
    split = (holdout(src.cfg.data, index, source) if source is not None else
             holdout(dataclasses.replace(src.cfg.data, shards=where, sources=[]), index) if ours else None)
    if args.episodes is not None:
        chosen, how = parse_episodes(args.episodes, index, where), "--episodes"
    elif split is not None and split.val:
        chosen, how = split.val, "the run's validation episodes (data.val_*)"
    else:
        chosen = tuple(e.episode_index for e in index.episodes)
        how = "every episode (the run held none out)" if ours else "every episode of --shards"
    trained = () if split is None else tuple(e for e in chosen if e not in set(split.val))
    return chosen, how, trained
