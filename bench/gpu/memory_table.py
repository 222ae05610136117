"""The memory estimate beside every measured GPU peak: bench/results/memory.md, and the fit of a
family's constants.

    python bench/gpu/memory_table.py              # the table on the terminal (every family with measurements)
    python bench/gpu/memory_table.py --write      # ... into bench/results/memory.md
    python bench/gpu/memory_table.py --fit pi05   # least-squares constants from the family's measurements

The measurements live in each family's record (`Family.memory.measured`, e.g.
trainkit/models/pi05/memory.py), the estimate is `trainkit inspect`'s (`inspect_model`, meta
device, no GPU). A new family's rows appear once its record lists its runs; --fit gives the
constants to put beside them. The estimate is the largest of three moments (the turn, a
reduce-scatter, the optimiser step), each linear in the three constants, so the fit is
Gauss-Newton: the slope of every run's estimate in each constant at the current values, numpy
least squares on the relative error, repeated; a constant stays >= 0, `--fix NAME` keeps it. The
family's switchable terms (`MemoryCalibration.terms`: what parallel.attention or FP8 changes, each
listed there) are fitted beside them as `terms.NAME`. A run that ran out of memory counts only
while estimated under the GPU's memory (then heavily).

    python bench/gpu/memory_table.py --fit gr00t --fix backward_block
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

from trainkit.config import load_config
from trainkit.estimate.inspect import inspect_model
from trainkit.models import FAMILIES, Family, MemoryCalibration, MemoryMeasurement, register

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "trainkit" / "configs"
OUT = ROOT / "bench" / "results" / "memory.md"
TOLERANCE = 0.10  # the bound on |estimate / measured - 1|
CONSTANTS = ("saved_compiled", "saved_eager", "backward_block")


def estimate(m: MemoryMeasurement) -> dict:
    """inspect's memory report for the run `m` measured."""
    cfg = load_config(CONFIGS / m.config, list(m.sets), required=False)
    return inspect_model(cfg, world_size=m.world_size)["memory"]


def _calib(values: dict[str, float], measured: tuple[MemoryMeasurement, ...] = ()) -> MemoryCalibration:
    """The calibration of `values`: the CONSTANTS by name, a term's coefficient as "terms.NAME"."""
    terms = {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("terms.")}
    return MemoryCalibration(**{c: values[c] for c in CONSTANTS}, terms=terms, measured=measured)


def _with(fam: Family, calib: MemoryCalibration) -> None:
    register(dataclasses.replace(fam, memory=calib))


OOM_MARGIN = 0.001  # the fit aims an out-of-memory run this far over the GPU's memory (rounding)
OOM_WEIGHT = 100.0  # ... and weighs it this much while under: a bound, not a measurement to average


def _error(m: MemoryMeasurement, est: float, margin: float = 0.0) -> float:
    """The relative error of an estimate; an out-of-memory run's only below its bound (else 0)."""
    err = est / (m.peak_gib * (1 + margin if m.out_of_memory else 1)) - 1
    return min(err, 0.0) if m.out_of_memory else err


def fit(name: str, fixed: tuple[str, ...] = (), rounds: int = 8) -> MemoryCalibration:
    """The constants minimising the squared relative error over the family's measurements (an
    out-of-memory run counts only while estimated under the GPU), each at least 0. The estimate
    is the largest of its moments (trainkit/estimate/memory.py), linear in the constants within
    one, so Gauss-Newton on the slopes at the current constants; `fixed` constants keep theirs."""
    fam = FAMILIES[name]
    rows = fam.memory.measured
    if not rows:
        raise SystemExit(f"family {name!r} lists no measured runs (Family.memory.measured)")
    k = {**{c: float(getattr(fam.memory, c)) for c in CONSTANTS},
         **{f"terms.{t}": float(v) for t, v in fam.memory.terms.items()}}
    unknown = sorted(set(fixed) - set(k))
    if unknown:
        raise SystemExit(f"--fix {unknown[0]}: not a constant of {name!r} (its constants: {', '.join(k)})")
    free = [c for c in k if c not in fixed]
    measured = np.array([m.peak_gib * (1 + OOM_MARGIN if m.out_of_memory else 1) for m in rows])

    def peaks(values: dict[str, float]) -> np.ndarray:
        _with(fam, _calib(values))
        return np.array([estimate(m)["peak_gib"] for m in rows])

    def loss(est: np.ndarray) -> float:
        return float(sum((OOM_WEIGHT if m.out_of_memory else 1.0) * _error(m, e, OOM_MARGIN) ** 2
                         for m, e in zip(rows, est)))

    try:
        est = peaks(k)
        best = (loss(est), dict(k))
        for _ in range(rounds):
            slopes = np.array([(peaks({**k, c: k[c] + 0.01}) - est) / 0.01 for c in free]).T  # GiB per unit
            live = [i for i, m in enumerate(rows) if not m.out_of_memory or est[i] < measured[i]]
            # a constant no run moves keeps its value
            used = [j for j, c in enumerate(free) if np.abs(slopes[live, j]).sum() > 0]
            if not used:
                break
            w = np.sqrt([OOM_WEIGHT if rows[i].out_of_memory else 1.0 for i in live])[:, None]
            a = w * slopes[np.ix_(live, used)] / measured[live, None]
            step = np.linalg.lstsq(a, w[:, 0] * (measured[live] - est[live]) / measured[live], rcond=None)[0]
            k = {**k, **{free[j]: max(0.0, k[free[j]] + d) for j, d in zip(used, step)}}
            est = peaks(k)
            if loss(est) < best[0] - 1e-12:
                best = (loss(est), dict(k))
            elif np.abs(step).max() < 1e-4:
                break
    finally:
        register(fam)
    return _calib({c: round(v, 4) for c, v in best[1].items()}, rows)


def table() -> tuple[str, float]:
    """The Markdown table of every family's measured runs, and the largest relative error (an
    out-of-memory run's: how far under the GPU's memory its estimate is, 0 when over)."""
    lines = ["| family | config | --set | GPUs | measured peak (GiB) | estimate (GiB) | error | at | source |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    worst = 0.0
    for name, fam in sorted(FAMILIES.items()):
        for m in fam.memory.measured:
            mem = estimate(m)
            est = mem["peak_gib"]
            err = _error(m, est)
            worst = max(worst, abs(err))
            sets = "<br>".join(f"`{s}`" for s in m.sets) or "-"
            peak = f"out of memory (> {m.peak_gib:.1f})" if m.out_of_memory else f"{m.peak_gib:.2f}"
            shown = (f"{'over' if est > m.peak_gib else 'UNDER'} ({100 * (est / m.peak_gib - 1):+.1f}%)"
                     if m.out_of_memory else f"{100 * err:+.1f}%")
            lines.append(f"| {name} | `{m.config}` | {sets} | {m.world_size} | {peak} | {est:.2f} | {shown} | "
                         f"{mem['moment'].replace('_', ' ')} | {m.source} |")
    return "\n".join(lines), worst


HEADER = """# Memory: `trainkit inspect`'s estimate beside every measured GPU peak

Measured = torch.cuda.max_memory_allocated per GPU, the trainer's "peak memory (allocated)", as
recorded for each run (sources in the table: the raw JSON beside this file and the variant in it;
commands in bench/results/trainkit.md). Estimate = `trainkit inspect CONFIG --set ...
--world-size N` today (meta device, no GPU), the model of trainkit/estimate/memory.py with the
family's constants (`Family.memory`: trainkit/models/pi05/memory.py, trainkit/models/gr00t/memory.py,
trainkit/models/dreamzero/memory.py, where the runs are listed). Written by
`python bench/gpu/memory_table.py --write`; tests/trainkit/estimate/test_trainkit_memory.py holds every row within 10%
and a run that ran out of memory over the GPU's memory.

## The model, and what the runs taught it

The estimate is the largest of three moments of a step (column "at"):
- **the turn** from forward to backward: all saved activations alive, no gradients yet
  (`zero_grad(set_to_none=True)` frees them every step). pi05 peaks here at every measured setting.
- **a reduce-scatter**: FSDP2 reduces each unit's gradients right after its backward (reverse
  forward order, the root last). Alive: the fp32 gradients of the units reduced so far, the
  activations the blocks before the unit still keep, the root and the prefetched unit, and the
  unit's reduce buffers (FSDP2's fp32 reduce-scatter input beside the bf16 gradients or its
  output: 8 B per trained parameter of the unit at world size 1). With one root unit and every
  block recomputed this is the peak: gr00t's baseline 29.30 GiB estimated for 29.45 measured,
  dreamzero's 93.59 for 93.74, where the turn says 25.6 and 67.8 (-13%, -28%).
- **the optimiser step**: every fp32 gradient alive with the weights and AdamW states (16 B per
  trained parameter). CUDA graphs make it gr00t's peak at micro-batch 16: a replay allocates
  nothing, so a graphed run peaks at its capture (step 0, before AdamW has states) or here
  (21.94 GiB for 22.19, at horizon 16 and 50 alike).

The two later moments are counted byte for byte; only the saved activations take the family's
ratios (and its switchable terms, below).

pi05 (at the turn, but for the one-GPU baseline: its root unit's reduce-scatter):
- **fp32 weights + AdamW m, v: 12 bytes/param, sharded; gradients not at the peak.** The old
  estimate counted 16 bytes (gradients too). The one-GPU run settles it: pi05_optimised at
  micro-batch 32 peaked at 102.3 GiB on one H200 and 84.36 GiB per GPU on two, +17.9 GiB;
  12 B x 3.24B params / 2 = 18.1 GiB, 16 B would be 24.2 GiB. Under gradient accumulation the
  fp32 gradients live across micro-batches and are counted.
- **Activations, compiled: 0.82 x the eager count.** Micro-batch 32 -> 40 -> 48 -> 56 adds 16.1 GiB
  per 8 samples (2.01 GiB/sample) against 2.27 GiB/sample counted for eager (masked attention):
  Inductor recomputes pointwise ops in backward instead of saving them. Eager
  (`parallel.compile=false`) measured +15.2 GiB at micro-batch 40: 0.98 x the count.
- **Switchable terms** (`memory_terms` in trainkit/models/pi05/flops.py, on as parallelize()
  applies the switches, x the block's ratio): `parallel.attention = "masked"` keeps one
  query-sized tensor per attention call more than "varlen" (x 1.18: masked vs varlen at
  micro-batch 32 on one H200, 102.27 vs 100.62 GiB, 1.65 estimated); FP8 on the linears
  `parallel.float8_modules` matches frees their bf16 inputs (x 1.05: + FP8 GeGLU 88.73 GiB, 11.89
  less, 12.33 estimated). Varlen + FP8 cost 1.59 GiB/sample (micro-batch 32 -> 40 -> 48: 88.73,
  101.46, 114.19) where masked bf16 cost 2.01. Without the terms the shipped config (micro-batch 48,
  one GPU) was estimated 134.9 GiB for 114.19 measured (+18%); with them 114.19.
- **The block in backward: 1.19 x its eager set** in gradient temporaries, plus its own forward again
  when it is recomputed (while the blocks before it hold their inputs): what makes
  recompute-everything peak at 30.8 GiB, not the 22.8 GiB of weights, states, gathered units and
  block inputs.
- **Gathered parameters** (bf16): root + 2 units with per-block FSDP (one computing, one
  prefetched), everything with `reshard_after_forward=false` (+4.5 GiB measured, 4.55 estimated)
  or one root unit.
- **Allocator, with and without expandable segments:** the allocated peak moved by 0.2%
  (100.47 vs 100.69 GiB), so the estimate has one figure for both. The reserve beyond allocated is
  not recorded by the trainer. What the runs show of it: micro-batch 48 (116.6 GiB allocated,
  83% of the card) ran at full speed, micro-batch 56 (132.7 GiB, 95%) thrashed the allocator
  (2.2 s steps, half the throughput), so keep a cap at or below ~85% of the card.

Remaining pi05 misses, all under 4%: one root FSDP unit measured 3.9 GiB more than the model says
(109.27 vs 105.35), the 2-GPU baseline (root unit, recompute everything, eager, 3 slots) 0.9 GiB
more (38.73 vs 37.84), recompute-everything 0.6 GiB less (30.81 vs 31.42). The later moments hold
pi05's peak only with one root unit and every block recomputed on one GPU (the baseline: 60.41
estimated at the root's reduce-scatter for 60.59 measured) or at small micro-batches (the root's
reduce-scatter of full, ~50 GiB on one GPU up to micro-batch 6 compiled), not otherwise measured.

gr00t (8 runs of the earlier N1.6-shaped model, one H200, within 1.8%; no longer listed, the
constants stay as N1.7's prior): compiled blocks keep 0.77 x the eager count (the two
micro-batch 128 runs), eager blocks 1.16 x (one run, no FSDP: the activations are 3 of its 23
GiB, so this ratio is loose); `backward_block` is pi05's 1.302 (no run recomputes, so it cannot
be told from the saved ratio). Without graphs at micro-batch 16 the peak is the first DiT unit's
reduce-scatter, 1.6 GiB over the graphed run (23.80 estimated, 23.82 measured).

dreamzero (5 runs of the earlier shape stand-in, one H200, within 0.8%; no longer listed, the
constants stay as the real model's prior, whose first run, the table's row, they estimate 4.4%
over): the "blocks" attention keeps 2.41 GiB per sample more
than "flex" (measured; its concatenated key/value spans and per-part outputs count 2.51, now in
the family's activation count), compiled blocks keep 0.97 x the count. The optimised config as
written (micro-batch 4, blocks) ran out of memory: a lower bound the estimate clears by 0.1 GiB
(139.92 for the card's 139.8). Fitted without that bound the ratio is 0.967 and the estimate
139.3 GiB: under the card, but the CUDA context (outside the allocator) and fragmentation leave
less than 139.8 GiB to allocate, so a 139.3 GiB demand can still fail; the bound sets the ratio
within 0.8% of the unbounded fit. `saved_eager` stays 1.0 (no eager run peaks at the turn).

Not measured yet, so only the model speaks for them: recompute of some blocks (strides 2, 4: the
runs have none or every block), world sizes above 2, gr00t or dreamzero on more than one GPU,
the tiny presets on a GPU. `trainkit tune` measures such settings: each row of its tune.json has
the estimate beside the measured peak, ready to join the family's list.

## Adding a family's rows

List the family's measured runs in its record (`MemoryCalibration(measured=(MemoryMeasurement(
config=..., sets=..., world_size=..., peak_gib=..., source="bench/results/<raw>.json: <variant>"),
...))`; a run out of memory with `out_of_memory=True` and the GPU's memory as `peak_gib`), run
`python bench/gpu/memory_table.py --fit <family>` (`--fix` a constant no run can separate), put the
printed constants beside the list, and `python bench/gpu/memory_table.py --write`: its rows join the
table below, and the test checks them. Until then a family uses the eager count (constants 1.0)
and `inspect` reports `calibrated: false`.

## Every measured run
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    p.add_argument("--fit", metavar="FAMILY", help="print least-squares constants for FAMILY's measurements")
    p.add_argument("--fix", action="append", default=[], metavar="NAME",
                   help=f"with --fit: keep this constant ({', '.join(CONSTANTS)}, terms.NAME) at the family's "
                        f"value (repeatable)")
    args = p.parse_args(argv)
    if args.fit:
        calib = fit(args.fit, tuple(args.fix))
        print(", ".join(f"{c}={getattr(calib, c)}" for c in CONSTANTS)
              + "".join(f", terms.{t}={v}" for t, v in calib.terms.items()))
        _with(FAMILIES[args.fit], calib)
    text, worst = table()
    body = f"{HEADER}\n{text}\n\nLargest error: {100 * worst:.1f}% (bound: {100 * TOLERANCE:.0f}%).\n"
    if args.write:
        OUT.write_text(body)
        print(f"wrote {OUT} (largest error {100 * worst:.1f}%)")
    else:
        print(body)
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
