"""Run the probe (`bench/gpu/probes/pi05_fsdp_probe.py`, unmodified) under torch.profiler over its timed
steps and reduce the trace like trainkit's own profiles, so the probe's kernel mix can be compared
with the trainer's kernel by kernel.

    torchrun --nproc-per-node 2 bench/gpu/profile_probe.py opt_compile_noac_mbs32
    PROBE_MBS=40 torchrun --nproc-per-node 2 bench/gpu/profile_probe.py opt_compile_noac_mbs40

Options (environment): PROBE_MBS=n adds the best setting at micro-batch n; PROBE_NORM_INIT=ones
sets the norm weights to 1 after the probe's init (an older copy of the probe zeroed every 1-D
parameter, so its LayerNorm/RMSNorm outputs were 0 and most of its GEMMs multiplied zeros, which
draws less power and buys higher clocks on a power-capped GPU; the current probe sets them to 1
itself, so this changes nothing there); PROBE_PROFILE=0 times without the profiler.

How: the probe times its steps between two `time.perf_counter()` calls after a synchronize; its
module's `time` is replaced by a clock that opens the profiler at the first call and closes it at
the second. The probe's own figures are printed as usual (slightly slowed by the profiler);
rank 0 then prints one JSON line {"probe_profile": summary}.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "bench" / "gpu" / "probes" / "pi05_fsdp_probe.py"
sys.path.insert(0, str(ROOT))
from trainkit.observe.profile import gemm_table, gpu_kernels, timeline_summary, top_kernels  # noqa: E402

STEPS = 8  # the probe's timed steps


class ProfilingClock:
    """Stands in for the probe's `time` module: odd calls open a profiler window, even calls close it."""

    def __init__(self) -> None:
        self.calls, self.prof, self.t0, self.summary = 0, None, 0.0, {}

    def perf_counter(self) -> float:
        self.calls += 1
        if os.environ.get("PROBE_PROFILE", "1") == "0":
            return time.perf_counter()
        if self.calls % 2 == 1:
            self.prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                           torch.profiler.ProfilerActivity.CUDA],
                                                record_shapes=True)
            self.prof.__enter__()
            self.t0 = time.perf_counter()
            return self.t0
        now = time.perf_counter()
        self.prof.__exit__(None, None, None)
        kernels = gpu_kernels(self.prof)
        s = timeline_summary(kernels, int((now - self.t0) * 1e9))
        self.summary = {k: v / STEPS for k, v in s.items()} | {"steps": STEPS, "per": "step",
                                                                "top_kernels": top_kernels(kernels, per=STEPS),
                                                                "gemms": gemm_table(self.prof, per=STEPS)}
        return now


def set_norms_to_one(probe) -> None:
    """After the probe initialises its model (zeros for every 1-D parameter) and before it builds
    the optimiser, set every LayerNorm/RMSNorm weight to 1 (biases stay 0), as trained norms are O(1)."""
    built = []

    class Recorded(probe.Pi05):
        def __init__(self):
            super().__init__()
            built.append(self)

    probe.Pi05 = Recorded
    adamw = torch.optim.AdamW

    def adamw_after_norms(params, *args, **kw):
        with torch.no_grad():
            for m in built[-1].modules():
                if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm)):
                    m.weight.fill_(1.0)
        return adamw(params, *args, **kw)

    probe.torch.optim.AdamW = adamw_after_norms


def main() -> None:
    spec = importlib.util.spec_from_file_location("pi05_fsdp_probe", PROBE)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    clock = ProfilingClock()
    probe.time = clock
    mbs = int(os.environ.get("PROBE_MBS", 0))
    if mbs:  # the probe's best setting at another micro-batch (a measuring stick at the trainer's shapes)
        probe.VARIANTS[f"opt_compile_noac_mbs{mbs}"] = dict(probe.VARIANTS["opt_compile_noac_mbs32"], mbs=mbs)
    if os.environ.get("PROBE_NORM_INIT") == "ones":
        set_norms_to_one(probe)
    sys.argv = [sys.argv[0], *sys.argv[1:2]]  # one variant: one profile
    probe.main()
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps({"probe_profile": clock.summary}), flush=True)


if __name__ == "__main__":
    main()
