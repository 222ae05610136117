"""The end of a run: steady-state figures from the metric intervals, as one JSON file
(`<output.dir>/summary.json`, rank 0) and one table on the terminal.

Steady state leaves out the intervals that start before `skip_steps` (compilation, allocator and
loader warm-up; by default the first interval), then takes the median of each figure, so one slow
interval (a checkpoint, a profile) does not move it. Peak memory is the maximum over the run.
A figure the device cannot give (MFU with no known peak, memory off CUDA) is None, "n/a" in the table.
"""
from __future__ import annotations

import statistics
from typing import Any

from trainkit.observe.metrics import format_mem, format_mfu
from trainkit.observe.source_loss import SOURCE_PREFIX

VAL_SOURCE_PREFIX = "val_loss/"  # an eval record's key of a mixture source's validation loss

STEADY_KEYS = ("step_time_s", "samples_per_s_gpu", "tokens_per_s_gpu", "mfu", "data_wait_s", "data_wait_frac",
               "all_gathers_per_step")


def steady_state(history: list[dict[str, Any]], skip_steps: int | None = None) -> dict[str, Any]:
    """Medians of the interval figures over intervals starting at or after step `skip_steps`
    (None: all but the first interval); the last interval alone if none qualifies."""
    if not history:
        return {}
    if skip_steps is None:
        rows = history[1:] or history
    else:
        rows = [h for h in history if h["step"] + 1 - h["steps"] >= skip_steps] or history[-1:]
    out: dict[str, Any] = {k: _median([h[k] for h in rows]) for k in STEADY_KEYS}
    out["peak_flops"] = history[-1].get("peak_flops")
    mem = [h["peak_mem_gib"] for h in history]
    out["peak_mem_gib"] = None if None in mem else max(mem)
    reserved = [h.get("peak_reserved_gib") for h in history]
    out["peak_reserved_gib"] = None if None in reserved else max(reserved)
    out["intervals"] = len(rows)
    out["from_step"] = rows[0]["step"] + 1 - rows[0]["steps"]
    return out


def _median(values: list[Any]) -> Any:
    """The median, or None where the figure was not measured (MFU on a device with no peak)."""
    return None if any(v is None for v in values) else statistics.median(values)


def run_summary(history: list[dict[str, Any]], losses: dict[int, float], *, world_size: int, global_batch: int,
                start_step: int, info: dict[str, Any]) -> dict[str, Any]:
    """What `summary.json` holds: the run's identity (`info`), steady state, first/last loss and,
    for a mixture, per source its first and last interval's loss (`source_loss`)."""
    steps = sorted(losses)
    return {**info, "world_size": world_size, "global_batch": global_batch, "start_step": start_step,
            "steps_run": len(steps), "first_loss": losses[steps[0]] if steps else None,
            "last_loss": losses[steps[-1]] if steps else None, "source_loss": source_loss(history),
            "steady": steady_state(history)}


def source_loss(history: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{source name: {"first", "last"}}: its loss in the first and last interval that had its samples."""
    out: dict[str, dict[str, float]] = {}
    for h in history:
        for key, value in h.items():
            if key.startswith(SOURCE_PREFIX):
                out.setdefault(key[len(SOURCE_PREFIX):], {"first": value})["last"] = value
    return out


def model_shape(fam: Any, preset: str, overrides: dict[str, Any], built: Any, params: int) -> dict[str, Any]:
    """What summary.json says of the model: the preset named (`preset`), the preset whose shape the run
    really has (`shape_preset`: the named one without shape settings, another when model.* settings or
    model.init_from made the model exactly that one, None when it is none of them), the fields set on
    top of the named preset and the parameter count: a run from a tiny checkpoint under `full` is not
    reported as `full`."""
    same = [name for name, make in fam.presets.items() if make() == built]
    shape = preset if preset in same else (same[0] if same else None)
    return {"preset": preset, "shape_preset": shape, "model_settings": sorted(overrides), "params": params}


def _model_row(s: dict[str, Any]) -> str:
    """`family / preset (N params)`, and where the run's shape is not that preset's, what it is."""
    name, shape, params = s.get("preset"), s.get("shape_preset", s.get("preset")), s.get("params")
    count = [f"{_count(params)} params"] if params else []
    if shape == name:
        said = count
    elif shape is not None:
        said = [f"model.preset {name}, its shape set to {shape}'s", *count]
        name = shape
    else:
        fields = s.get("model_settings") or []
        said = [f"+ {len(fields)} model settings: " + ", ".join(fields[:4]) + (", ..." if len(fields) > 4 else ""),
                *count]
    return f"{s.get('family')} / {name}" + (f" ({'; '.join(said)})" if said else "")


def _count(n: int) -> str:
    for scale, prefix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.2f}{prefix}"
    return str(n)


def format_summary(s: dict[str, Any]) -> str:
    """The summary as an aligned two-column table for the terminal."""
    st = s.get("steady") or {}
    rows = [("model", _model_row(s)), ("ranks x global batch", f"{s['world_size']} x {s['global_batch']}"),
            ("steps", f"{s['start_step']} -> {s['start_step'] + s['steps_run']}")]
    if s["first_loss"] is not None:
        rows.append(("loss first -> last", f"{s['first_loss']:.4f} -> {s['last_loss']:.4f}"))
    for name, loss in (s.get("source_loss") or {}).items():  # a mixture: per source, first -> last interval
        rows.append((f"  {name}", f"{loss['first']:.4f} -> {loss['last']:.4f}"))
    last_eval = (s.get("evals") or [None])[-1]  # trainkit/validation.py
    if last_eval is not None:
        ema = f", EMA weights {last_eval['val_loss_ema']:.4f}" if "val_loss_ema" in last_eval else ""
        rows.append((f"validation loss (after step {last_eval['step'] + 1})", f"{last_eval['val_loss']:.4f}{ema}"))
        for key, loss in last_eval.items():  # a mixture: each source's (validation.MixtureValidation)
            if key.startswith(VAL_SOURCE_PREFIX):
                ema = last_eval.get(f"val_loss_ema/{key[len(VAL_SOURCE_PREFIX):]}")
                rows.append((f"  {key[len(VAL_SOURCE_PREFIX):]}", f"{loss:.4f}" + (f", EMA weights {ema:.4f}"
                                                                                    if ema is not None else "")))
    if st:
        # the k-th step, as the step lines count (summary.json's from_step is metrics.jsonl's 0-based index)
        rows += [(f"steady state (from step {st['from_step'] + 1}, median of {st['intervals']})", ""),
                 ("  step time", f"{st['step_time_s'] * 1e3:.0f} ms"),
                 ("  samples/s per GPU", f"{st['samples_per_s_gpu']:.2f}"),
                 ("  tokens/s per GPU", f"{st['tokens_per_s_gpu']:.0f}"),
                 (f"  MFU (model FLOPs / {st['peak_flops'] / 1e12:.0f} TFLOP/s)" if st.get("peak_flops") else "  MFU",
                  format_mfu(st["mfu"])),
                 ("  data wait", f"{100 * st['data_wait_frac']:.2f}% of step time"),
                 ("  all-gathers per step", f"{st['all_gathers_per_step']:.0f}"),
                 ("peak memory (allocated)", format_mem(st["peak_mem_gib"]))]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
