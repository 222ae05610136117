"""Fine-tuning Pi0.5 `full` from a checkpoint (`model.init_from`) against the same run from random
init, on one GPU, through `trainkit run` from real shards through the loader (issue 17).

    python3 bench/bench_init_from_gpu.py --out $OUT --steps 30 --micro-batch 16      # on the device
    python3 bench/bench_init_from_gpu.py --out /tmp/x --cpu                          # dry run: tiny preset

1. Shards: generated PNG-column LeRobot dataset -> `datakit convert` (bench_trainkit_gpu.make_shards).
2. The checkpoint: the `full` model with random weights (trainkit's init, norm scales and adaRMS
   modulations then perturbed so nothing is at a degenerate value), written by trainkit's own
   export path (`Family.weights.export_tensors` + `write_weights`, what `trainkit export` runs) in
   the `pi05_base` layout (`--format openpi`: unprefixed keys, no embed_tokens, bfloat16).
3. `trainkit run trainkit/configs/pi05_optimised.toml` with `model.init_from` set, then the same
   run from random init (same seed, steps, batch, switches). Each run is its own process.
Written to $OUT/init_from.json after every phase: the checkpoint's size and write time, each
run's load time (summary.json's init_from.seconds), steady state after `--skip` steps (samples/s,
step time, MFU, peak memory), wall time and losses, and the ratio init_from / random samples/s.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
CONFIG = ROOT / "trainkit" / "configs" / "pi05_optimised.toml"


def write_checkpoint(folder: Path, preset: str, device: str) -> dict:
    """A random `preset` model in the pi05_base layout (bfloat16), through trainkit's export path."""
    import torch

    from trainkit.models import build_model, family
    from trainkit.weights.load import write_weights

    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = build_model("pi05", preset)
    model.to_empty(device=device)
    model.init_weights()
    with torch.no_grad():  # no norm at exactly 1, no modulation at exactly 0
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.add_(torch.randn_like(p), alpha=0.05)
            elif ".ada." in name or name.startswith("final_ada"):
                p.normal_(0, 0.02)
    fam = family("pi05")
    tensors = fam.weights.export_tensors(model.cfg, model.state_dict(), "openpi")
    tensors = {k: v.to("cpu", torch.bfloat16, copy=True) for k, v in tensors.items()}
    del model
    config = fam.weights.config_json(build_model_cfg(preset), {"cameras": ["observation.images.top",
                                     "observation.images.wrist"], "state_dim": 8, "action_dim": 7})
    config["dtype"] = "bfloat16"
    write_weights(folder, tensors, config)
    count = len(tensors)
    del tensors
    if device == "cuda":
        torch.cuda.empty_cache()  # the runs are other processes: leave them the whole GPU
    size = (folder / "model.safetensors").stat().st_size
    return {"seconds": round(time.perf_counter() - t0, 2), "bytes": size, "tensors": count,
            "layout": "openpi (pi05_base)", "dtype": "bfloat16"}


def build_model_cfg(preset: str):
    from trainkit.models import build_config
    return build_config("pi05", preset)


def run(name: str, sets: list[str], args, timeout: float) -> dict:
    out_dir = args.work / name
    shutil.rmtree(out_dir, ignore_errors=True)
    sets = [f"data.shards={args.shards}", f"output.dir={out_dir}", f"train.steps={args.steps}",
            f"train.micro_batch={args.micro_batch}", f"output.log_every={args.log_every}", "output.progress=false",
            "output.resume=false", *args.sets, *sets]
    cmd = [sys.executable, "-m", "trainkit.cli", "run", str(CONFIG), *[x for s in sets for x in ("--set", s)]]
    res: dict = {"run": name, "command": " ".join(["python3", *cmd[1:]])}
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(10.0, timeout),
                              env={**os.environ, "PYTHONUNBUFFERED": "1",
                                   "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
        res["rc"], tail = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        res["rc"] = "timeout"
        tail = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(errors="replace")
    res["wall_s"] = round(time.time() - t0, 1)
    res["init_line"] = next((x for x in tail.splitlines() if "model.init_from" in x), None)
    if (out_dir / "summary.json").exists():
        summary = json.loads((out_dir / "summary.json").read_text())
        res["summary"] = summary
        res["init_from_s"] = (summary.get("init_from") or {}).get("seconds")
    lines = [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()] \
        if (out_dir / "metrics.jsonl").exists() else []
    res["losses"] = [round(x["loss"], 5) for x in lines if x["kind"] == "step"]
    res["intervals"] = [x for x in lines if x["kind"] == "interval"]
    if res["intervals"]:
        from trainkit.observe.summary import steady_state
        res["steady"] = steady_state(res["intervals"], args.skip)
    if res["rc"] != 0:
        res["error_tail"] = tail[-2500:]
    print(json.dumps({k: v for k, v in res.items() if k not in ("summary", "intervals", "losses", "error_tail")}),
          flush=True)
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--skip", type=int, default=10, help="steps left out of steady state (compile, warm-up)")
    p.add_argument("--episodes", type=int, default=4, help="generated episodes (x --length frames, 2 cameras)")
    p.add_argument("--length", type=int, default=60)
    p.add_argument("--budget-s", type=float, default=130, help="the whole script; each run gets what is left")
    p.add_argument("--set", dest="sets", action="append", default=[], help="extra override for both runs")
    p.add_argument("--work", type=Path, default=Path("/tmp/init_from_bench"))
    p.add_argument("--cpu", action="store_true", help="dry run: tiny preset, float32, no compile, CPU")
    args = p.parse_args()
    end = time.time() + args.budget_s
    import torch

    from bench_trainkit_gpu import make_shards

    args.out.mkdir(parents=True, exist_ok=True)
    if args.cpu:
        args.sets += ["model.preset=tiny", "parallel.param_dtype=float32", "parallel.compile=false",
                      "data.num_workers=1", "optim.fused=false"]
    res = {"command": " ".join(["python3", *sys.argv]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__}

    def save() -> None:
        (args.out / "init_from.json").write_text(json.dumps(res, indent=1) + "\n")

    t0 = time.time()
    args.shards = make_shards(args.work / "data", 64 if args.cpu else 224, episodes=args.episodes, length=args.length)
    res["shards_s"] = round(time.time() - t0, 1)
    ckpt = args.work / "pi05_base_random"
    res["checkpoint"] = write_checkpoint(ckpt, "tiny" if args.cpu else "full", "cuda" if torch.cuda.is_available()
                                         else "cpu")
    save()
    print(json.dumps(res["checkpoint"]), flush=True)
    res["init_from"] = run("init_from", [f"model.init_from={ckpt}"], args, (end - time.time()) * 0.55)
    save()
    res["random_init"] = run("random_init", [], args, end - time.time())
    a, b = (res[k].get("steady", {}).get("samples_per_s_gpu") for k in ("init_from", "random_init"))
    res["samples_per_s_ratio"] = round(a / b, 4) if a and b else None
    save()
    print(json.dumps({"ratio": res["samples_per_s_ratio"], "load_s": res["init_from"].get("init_from_s")}))


if __name__ == "__main__":
    main()
