"""The training run, top to bottom: checks -> build -> parallelize -> loop -> metrics -> checkpoint.

    torchrun --nproc-per-node 2 -m trainkit.cli run trainkit/configs/pi05_optimised.toml --set data.shards=out/
    python -m trainkit.cli run trainkit/configs/pi05_tiny.toml ...      # one process, no torchrun

Every input is checked before the GPU is touched (the config, output.dir, the shard folder and its
cameras, world size vs global batch, the memory estimate vs a stated cap and vs the device's
memory), so a bad launch fails at once with one line; then output.dir is locked for the run
(run_lock.py). At the end rank 0 writes `summary.json` (steady state, trainkit/observe/summary.py)
and prints it as a table.
The model is built on the meta device, parallelized (parallel/__init__.py says in
which order and why), materialised on the device and initialised from the seed; the loop takes
`micro_batch`-sized batches from the loader, accumulates to the global batch, clips, checks that
loss and grad norm are finite (nonfinite.py: stop, or skip the update), steps AdamW and the
schedule, and hands each step to `Metrics`; a mixture of datasets (`data.sources`) opens and checks
every source as one folder, logs each source's loss at log steps (observe/source_loss.py) and
validates each source on its own held-out episodes (validation.py). A
fresh run with `model.init_from` first fills the weights from that checkpoint (trainkit/weights/load.py). Checkpoints (DCP + trainkit.json, checkpoint/dcp.py) are
written every `output.checkpoint_every` steps and after the last step (`output.save_last`), the
newest `output.keep_checkpoints` kept, and a run resumes from the newest intact one in `output.dir`
under the rules of resume_rules.py.
Under `trainkit run` a SIGTERM or the first Ctrl-C (SIGINT) (`StopSignals`) ends the run at the next
step boundary, the same on every rank: the step under way finishes, a checkpoint of it is written
(`checkpoint_due`), one line, exit 143 / 130. A second Ctrl-C exits at once (KeyboardInterrupt).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from datakit.durable import write_atomic
from datakit.loader.gpu_batch import gil_switch_interval
from trainkit.checkpoint.dcp import Found, find_checkpoint, load_checkpoint, save_checkpoint
from trainkit.config import DataConfig, OutputConfig, RunConfig, loader_sources
from trainkit.estimate.auto_batch import AUTO, resolve_micro_batch
from trainkit.estimate import inspect as estimate  # device_memory looked up at the call: tests state a card
from trainkit.data import MixtureShards, Shards, StepBatch, TrainData, read_mixture_shards, read_run_shards
from trainkit.optim.clip import clip_grad_norm
from trainkit.optim.ema import WeightEMA
from trainkit.errors import BatchDataError, ConfigError, LaunchError, Stopped
from trainkit.observe.metrics import CollectiveCounter, Metrics, StepRecord
from trainkit.models import Family, Fixed, build_model, family
from trainkit.optim.nonfinite import NonFiniteGuard, check_state
from trainkit.weights.norm_stats import check_dataset_stats, check_robot_dims, with_weights_stats
from trainkit.weights.shape import describe, with_weights_shape
from trainkit.weights.tokenizer_source import describe_tokenizer, keep_tokenizer, tokenizer_source
from trainkit.parallel import ParallelPlan, check_parallel, compute_dtype, parallelize
from trainkit.parallel.allocator import set_expandable_segments
from trainkit.parallel.init import init_weights
from trainkit.parallel.cudagraphs import EagerStep, micro_step
from trainkit.optim.optimizer import build_optimizer, build_scheduler
from trainkit.parallel.precision import autocast
from trainkit.observe.profile import StepProfiler
from trainkit.checkpoint.resume_rules import RunRecord, dataset_identity, recorded_config, resume_changes
from trainkit.checkpoint.run_lock import check_output_dir, run_lock
from trainkit.observe.sample_log import SampleLog
from trainkit.observe.source_loss import SourceLoss
from trainkit.observe.trackers import check_tracker, open_tracker
from trainkit.observe.summary import format_summary, model_shape, run_summary
from trainkit.validation import plan_validation
from trainkit.weights.load import check_weights, load_weights


@dataclass
class RunResult:
    """What a run returns to its caller (the CLI prints nothing more; tests and benches read it)."""

    losses: dict[int, float]  # step -> loss: the mean over the global batch (ranks and micro-batches)
    history: list[dict[str, Any]]  # interval summaries, as written to metrics.jsonl
    plan: ParallelPlan
    start_step: int  # 0, or the step a resumed run continued from
    profile: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)  # as written to summary.json (trainkit/observe/summary.py)


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) without it."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def grad_accumulation(cfg: RunConfig, world_size: int) -> int:
    """Micro-batches per optimiser step; the global batch must split evenly over the ranks."""
    per_step = cfg.train.micro_batch * world_size
    gb = cfg.train.global_batch or per_step
    if gb % world_size:
        raise LaunchError(f"train.global_batch={gb} is not divisible by the world size {world_size}")
    if gb % per_step:
        raise LaunchError(f"train.global_batch={gb} is not a multiple of micro_batch x world size "
                          f"= {cfg.train.micro_batch} x {world_size}")
    return gb // per_step


class StopSignals:
    """`with StopSignals() as stop: run(cfg, stop)`: the first SIGTERM (a scheduler's preemption,
    `kill`, torchrun passing one on) or SIGINT (Ctrl-C; torchrun passes it on too) only sets
    `signum`; the loop reads it at the next step boundary, where every rank agrees through the
    non-finite check's all-reduce, checkpoints and raises Stopped. The handler never interrupts a
    step or a save. A second SIGINT raises KeyboardInterrupt (exit at once: the CLI says so in one
    line, 130), and so does a SIGTERM after a SIGINT (torchrun turns a second Ctrl-C into a SIGTERM
    to its ranks). A later SIGTERM after a SIGTERM changes nothing (torchrun sends one to the ranks
    still finishing when the first exits); SIGKILL still ends the run at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Self:
        try:
            self._previous = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}
        except ValueError:  # not the main thread: no handler, the defaults stay
            self._previous = {}
        return self

    def __exit__(self, *exc: object) -> None:
        # once stopped, a later SIGTERM (torchrun's to the ranks still finishing when the first has
        # exited) must not kill the process on its way out: it exits 143 / 130 itself, as every rank does
        for s, before in self._previous.items():
            signal.signal(s, signal.SIG_IGN if self.signum and s == signal.SIGTERM else before)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum == signal.SIGINT or (self.signum and signum == signal.SIGINT):
            raise KeyboardInterrupt  # the second Ctrl-C: now, whatever is under way
        self.signum = self.signum or signum


def run(cfg: RunConfig, stop: StopSignals | None = None) -> RunResult:
    """Check, lock output.dir, train; `stop`: the SIGTERM / SIGINT flag `trainkit run` installs."""
    _, world_size, local_rank = world()
    # --- checks and the model's shape, before any GPU work -----------------------------------
    set_expandable_segments(cfg.parallel.expandable_segments)  # must precede the first CUDA allocation
    out = check_output_dir(cfg.output.dir, cfg.data.roots)
    check_tracker(cfg.output.tracker, out)  # its package installed, its folder not a file (an optional extra), before any work
    fam = family(cfg.model.family)
    cfg, fixed = with_weights_shape(cfg, out if cfg.output.resume else None)  # init_from's widths, heads...
    cfg = keep_tokenizer(cfg, fixed, out)  # init_from's tokenizer file, kept in output.dir for resume and export
    with torch.device("meta"):
        model = build_model(fam.name, cfg.model.preset, cfg.model.overrides)
    check_settings(cfg, model, world_size)  # the micro-batches per step come once "auto" is chosen, below
    if cfg.model.init_from and not (cfg.output.resume and (out / "checkpoints").is_dir()):
        check_weights(model, fam, cfg.model.init_from)  # a fresh run: its keys and shapes, from the file's header
    shards = open_shards(cfg.data, fam.max_slots(model.cfg))  # the index (each source's), read once for the run
    try:
        for part, root in shard_parts(shards, cfg.data):
            check_robot_dims(part.index, fam.robot_dims, model.cfg, root, from_weights=set(fixed))
        if cfg.data.norm_from == "checkpoint":  # the statistics the checkpoint was trained with (one folder)
            if not cfg.model.init_from:
                raise ConfigError("data.norm_from", "'checkpoint' needs model.init_from (the folder to read them from)")
            shards.index, source = with_weights_stats(shards.index, cfg.model.init_from, cfg.data.norm)
            say(f"normalisation statistics from {source}")
        else:  # the same rule for the dataset's own (a hand-edited index, a dimension q01 == q99 cannot scale)
            for part, root in shard_parts(shards, cfg.data):
                check_dataset_stats(part.index, cfg.data.norm, root)
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
        if cfg.train.micro_batch == AUTO:  # decided for this device's memory (on a CPU the host's), said
            cfg, choice = resolve_micro_batch(cfg, world_size, estimate.device_memory(device), model)
            say(choice.line())
        accum = grad_accumulation(cfg, world_size)
        estimate.check_memory(cfg, world_size, device, model)
        # --- devices and process group --------------------------------------------------------------
        if device.type == "cuda":
            torch.cuda.set_device(device)
        init_process_group(device, world_size, needed=cfg.parallel.fsdp != "none")
        # one run per output.dir, from the resume to the last checkpoint
        with run_lock(out), gil_switch_interval(cfg.data.gil_switch_ms / 1e3):
            return train(cfg, fam, model, shards, device, out, accum, stop, fixed)
    finally:
        shards.close()  # a URL root's download cache (the loader stops its downloads with it)


def check_settings(cfg: RunConfig, model: nn.Module, world_size: int, *, cuda: bool | None = None) -> int:
    """The checks of the settings alone, no data and no device touched (`model` on the meta device):
    what a launch refuses whatever the machine. Returns the micro-batches per step (0 for micro_batch =
    "auto", known once the card's memory chose it). `cuda`: whether
    the run has a CUDA device (None: this machine's answer); the preset test passes True, as a GPU
    host would run a shipped preset (tests/trainkit/config/test_trainkit_shipped_presets.py)."""
    if cfg.train.eval_every and not cfg.data.holds_out:
        raise ConfigError("train.eval_every", "needs held-out episodes: set data.val_episodes or data.val_fraction")
    accum = grad_accumulation(cfg, world_size) if cfg.train.micro_batch != AUTO else 0  # "auto": once chosen
    if cfg.optim.clip_in_step and not cfg.optim.fused:
        raise ConfigError("optim.clip_in_step", "clips inside fused AdamW's step (its grad_scale): set optim.fused = true")
    if cfg.train.nonfinite_check == "deferred" and not cfg.optim.fused:
        raise ConfigError("train.nonfinite_check", "'deferred' skips a non-finite update on the device through "
                          "fused AdamW's found_inf: set optim.fused = true (or nonfinite_check = 'sync')")
    if cfg.parallel.fsdp == "none" and world_size > 1:
        raise LaunchError("parallel.fsdp='none' trains one process; use 'root' or 'block' with torchrun")
    check_parallel(model, cfg.parallel, world_size, cuda=cuda)  # parallelize() applies them again
    return accum


def open_shards(dcfg: DataConfig, max_slots: int) -> Shards | MixtureShards:
    """data.shards, or every source of data.sources (opened and checked as one folder is)."""
    if dcfg.sources:
        return read_mixture_shards(dcfg, loader_sources(dcfg), max_slots, fps=dcfg.fps)
    return read_run_shards(dcfg, max_slots)


def shard_parts(shards: Shards | MixtureShards, dcfg: DataConfig) -> list[tuple[Shards, str]]:
    """(each opened folder, its data.shards / source root): what the launch checks run over."""
    if isinstance(shards, MixtureShards):
        return [(part, src.root) for part, src in zip(shards.parts, shards.sources)]
    return [(shards, dcfg.shards)]


def train(cfg: RunConfig, fam: Family, model: nn.Module, shards: Shards | MixtureShards, device: torch.device,
          out: Path, accum: int, stop: StopSignals | None = None, fixed: Fixed | None = None) -> RunResult:
    """Build, resume, loop, summarise: the run once its inputs are checked and output.dir is ours
    (`fixed`: the model fields model.init_from's checkpoint fixed, said once its weights loaded)."""
    rank, world_size, _ = world()
    global_batch = cfg.train.micro_batch * world_size * accum
    mcfg = model.cfg
    # --- build: parallelize on meta, then materialise and initialise from the seed --------------
    plan = parallelize(model, cfg.parallel, world_size)
    model.to_empty(device=device)
    torch.manual_seed(cfg.train.seed)
    init_weights(model)  # model.init_weights(), the weights of one process on a CPU mesh too (parallel/init.py)
    # a fresh run from the weights users have, before anything copies the weights (a resume reloads
    # its own checkpoint below, never init_from)
    found = find_checkpoint(out) if cfg.output.resume else None
    if found is not None and found.manifest.step >= cfg.train.steps:  # a finished run, rerun (output.save_last)
        say(f"{found.path} is step {found.manifest.step} of train.steps={cfg.train.steps}: nothing to train "
            f"(raise train.steps to continue it, or use another output.dir for a new run)")
        return RunResult(losses={}, history=[], plan=plan, start_step=found.manifest.step)
    init = load_weights(model, fam, cfg.model.init_from, say) if cfg.model.init_from and found is None else None
    if init is not None and fixed:  # after the load: a refused checkpoint prints its one line only
        say(f"model shape from model.init_from {cfg.model.init_from}: {describe(fixed)}")
        init["shape"] = {k: v for k, (v, _) in sorted(fixed.items())}
    opt = build_optimizer(model, cfg.optim, device)
    sched = build_scheduler(opt, cfg.optim, cfg.train.steps)
    ema = WeightEMA(model, cfg.train.ema_decay) if cfg.train.ema_decay else None  # starts at the init
    # whole episodes out of the training stream (validation.py; a mixture: each source's own)
    train_shards, episodes, val = plan_validation(cfg, shards, fam, mcfg, rank=rank, world_size=world_size,
                                                  device=device, image_dtype=compute_dtype(cfg.parallel))
    data = TrainData(cfg.data, train_shards, fam, mcfg, seed=cfg.train.seed, rank=rank, world_size=world_size,
                     micro_batch=cfg.train.micro_batch, device=device, image_dtype=compute_dtype(cfg.parallel),
                     global_batch=global_batch, episodes=episodes)
    if getattr(data.adapter, "note", ""):  # what the family's batches stand on (BatchAdapter.note)
        say(data.adapter.note)
    if hasattr(data.adapter, "check"):  # data made from the model's own weights (a cached backbone) match them
        data.adapter.check(model, compute_dtype(cfg.parallel))
    if hasattr(data.adapter, "flops_per_sample"):  # data that skips part of the model: the step's own count
        fam = dataclasses.replace(fam, flops_per_sample=data.adapter.flops_per_sample)
    # --- resume from the newest intact checkpoint of this run (resume_rules.py: what may change) --
    record = run_record(cfg, shards, global_batch)
    start = resume(found, record, world_size, model, opt, sched, cfg, ema, data) if found is not None else 0
    tokenizer = say_tokenizer(cfg, mcfg, fixed, rank)
    # --- loop ---------------------------------------------------------------------------------------
    counter, metrics, profiler = observers(cfg, out, rank, device, start)
    cast = autocast(cfg.parallel.param_dtype, device, enabled=plan.fsdp == "none")
    params = [p for p in model.parameters() if p.requires_grad]
    mixture = tuple(s.label for s in cfg.data.sources)  # a mixture's source names: their loss is logged apart
    # forward + backward, maybe a graph; with a mixture also the per-item losses
    # owned graph gradients without FSDP only: FSDP2's sharded gradients under them are not measured yet
    step_fn = micro_step(model, cast, accum, graphs=plan.cuda_graphs, per_item=bool(mixture),
                         grads=cfg.parallel.graph_grads if plan.fsdp == "none" else "zeroed")
    per_source = SourceLoss(mixture, device) if mixture else None
    guard = NonFiniteGuard(cfg.train.on_nonfinite, device, deferred=cfg.train.nonfinite_check == "deferred",
                           on_skip=metrics.discard)
    batches = data.batches()
    sample_log = SampleLog(out, rank) if cfg.output.record_samples else None
    metrics.start(start)
    try:
        for step in range(start, cfg.train.steps):
            profiler.before_step(step - start)
            tally = accumulate(step, accum, batches, step_fn, guard, fam, mcfg, sample_log, per_source)
            with record_function("trainkit.clip_and_check"):
                grad_norm = clip_grad_norm(params, cfg.train.grad_clip, opt if cfg.optim.clip_in_step else None)
                # NaN/inf: stop, or skip the update; and whether any rank got a SIGTERM or SIGINT
                applied = guard.step_ok(step, tally.loss, grad_norm, params, stop=stop.signum if stop else 0, opt=opt)
            with record_function("trainkit.optimizer"):
                if applied:  # deferred check: always, and the device skips a non-finite step's update itself
                    opt.step()
                    if ema is not None:
                        ema.update(skip=guard.skip_flag)
            sched.step()
            step_fn.zero_grad(opt)  # a graph writes into the gradients it captured: never set to None
            if per_source is not None:
                per_source.end_step(applied)
            if applied:
                metrics.record(StepRecord(step=step, loss=guard.mean_loss, grad_norm=grad_norm, lr=sched.get_last_lr()[0],
                                          data_wait_s=tally.wait, samples=tally.samples, flops=tally.flops,
                                          tokens=tally.tokens, image_slots=tally.slots))
            profiler.after_step(step - start)
            stopping = bool(guard.stop_signal) and step + 1 < cfg.train.steps  # the last step just ends the run
            if (step + 1) % cfg.output.log_every == 0 or step + 1 == cfg.train.steps or stopping:
                guard.settle(params)  # deferred: the verdicts of the steps about to be logged
                # the per-source all-reduce: at log steps only, on every rank alike
                metrics.flush(per_source.reduce() if per_source is not None else None)
            if val is not None and (step + 1 == cfg.train.steps or cfg.train.eval_every and
                                    (step + 1) % cfg.train.eval_every == 0):
                with metrics.paused():
                    metrics.log_eval(val.record(step, model, cast, ema))
            if stopping:
                metrics.close()  # before the save's collectives: no rank exits before rank 0 has logged
            saved = None
            if checkpoint_due(cfg.output, step + 1, cfg.train.steps, stopping=stopping):
                guard.settle(params)
                check_state(step, model, opt, device)  # a non-finite state is never saved
                saved = save_checkpoint(out, step + 1, model, opt, sched, data.state_dict(), record,
                                        keep=cfg.output.keep_checkpoints, extra={"ema": ema.state_dict()} if ema else None)
            if stopping:
                raise stopped(step + 1, cfg.train.steps, saved, guard.stop_signal)
        metrics.close()
    except BaseException:
        with contextlib.suppress(Exception):  # the original error is the one to report
            metrics.close()  # the steps done are logged, so a resume's metrics.jsonl has no gap
        raise
    finally:
        counter.uninstall()
        batches.close()
        if sample_log is not None:
            sample_log.close()
    summary = write_summary(cfg, out, rank, world_size, global_batch, start, plan, metrics, guard, data.skipped, init,
                            tokenizer, fam, mcfg, sum(p.numel() for p in model.parameters()))
    return RunResult(losses=dict(metrics.losses), history=metrics.history, plan=plan, start_step=start,
                     profile=profiler.summary, summary=summary)


def run_record(cfg: RunConfig, shards: Shards | MixtureShards, global_batch: int) -> RunRecord:
    """What a resume of this run checks against (resume_rules.py): the config, the global batch and the
    dataset's identity (a mixture: each source's)."""
    identity = [dataset_identity(part.folder) for part, _ in shard_parts(shards, cfg.data)]
    return RunRecord(config=recorded_config(cfg.to_dict()), global_batch=global_batch,
                     dataset=identity[0] if not cfg.data.sources else {"sources": identity})


def say_tokenizer(cfg: RunConfig, mcfg: Any, fixed: Fixed | None, rank: int) -> dict[str, str] | None:
    """The run's prompt tokenizer (tokenizer_source.py; None: the family has none), never a silent one:
    rank 0 says it on stdout with the run's log before the first step (stderr is for notes and refusals)."""
    tokenizer = tokenizer_source(cfg, mcfg, fixed or {})
    if tokenizer is not None and rank == 0:
        print(f"trainkit: {describe_tokenizer(tokenizer)}", flush=True)
    return tokenizer


def observers(cfg: RunConfig, out: Path, rank: int, device: torch.device,
              start: int) -> tuple[CollectiveCounter, Metrics, StepProfiler]:
    """The loop's observers from step `start`: the collective counter (installed: uninstall it), the metrics
    with their tracker, the profiler of output.profile_steps."""
    counter = CollectiveCounter().install()
    metrics = Metrics(out, rank, cfg.train.steps, device, progress=cfg.output.progress, counter=counter,
                      first_step=start,
                      tracker=open_tracker(cfg.output.tracker, out, rank=rank, start_step=start, config=cfg.to_dict()))
    return counter, metrics, StepProfiler(out, cfg.output.profile_steps, device, rank)


@dataclass
class StepTally:
    """What one optimiser step's micro-batches add up to (its `StepRecord`)."""

    loss: Any = 0.0  # the mean of the micro-batch losses: a tensor once one is added
    wait: float = 0.0  # host seconds blocked on the loader
    flops: float = 0.0
    tokens: int = 0
    samples: int = 0
    slots: int = 0  # image slots the last micro-batch carried


def accumulate(step: int, accum: int, batches: Iterator[StepBatch], step_fn: EagerStep, guard: NonFiniteGuard, fam: Family,
               mcfg: Any, sample_log: SampleLog | None, per_source: SourceLoss | None) -> StepTally:
    """Forward and backward of `accum` micro-batches (`step_fn`), gradients accumulated; the step's tally.
    Each batch's rows go to the non-finite guard, the sample log and, with a mixture, its per-item losses
    to `per_source`."""
    tally = StepTally()
    for micro in range(accum):
        t0 = time.perf_counter()
        try:
            with record_function("trainkit.next_batch"):  # named in the profile's idle_by_host
                batch = next(batches)
        except BatchDataError as e:  # a NaN state: the prompt cannot be built
            raise guard.data_error(step, e) from None
        tally.wait += time.perf_counter() - t0
        if sample_log is not None:
            sample_log.write(step, micro, batch.epoch, batch.step, batch.rows)
        guard.add(batch.rows, batch.actions)
        b, tally.slots = batch.samples, batch.slots
        with record_function("trainkit.micro_step"):
            loss, items = step_fn(batch.model)
        tally.loss = tally.loss + loss / accum
        if per_source is not None:
            per_source.add(items, batch.sources)
        tally.samples += b
        tally.flops += b * fam.flops_per_sample(mcfg, tally.slots)
        tally.tokens += b * fam.tokens_per_sample(mcfg, tally.slots)["sequence"]
    return tally


def resume(found: Found, record: RunRecord, world_size: int, model: nn.Module, opt: torch.optim.Optimizer,
           sched: Any, cfg: RunConfig, ema: WeightEMA | None, data: TrainData) -> int:
    """Load the newest intact checkpoint of this run into the model, optimiser, schedule, data stream
    and weight EMA; the step it resumes after. What may change on a resume, and is said once here,
    is resume_rules.py's."""
    for line in found.skip_lines("resuming from"):
        say(line)
    changes = resume_changes(found.path, found.record, found.manifest.world_size, record, world_size)
    saved_ema = ema is not None and found.manifest.config["train"].get("ema_decay", 0.0) > 0
    start, data_state = load_checkpoint(found, model, opt, sched, cfg.optim,
                                        extra={"ema": ema.state_dict()} if saved_ema else None)
    data.load_state_dict(data_state)
    say(f"resuming from {found.path} (step {start})")  # once it loaded: a refused resume is one line
    if ema is not None and not saved_ema:
        ema.reset()
        say(f"{found.path.name} holds no weight EMA; train.ema_decay starts it at the resumed weights")
    if changes:
        say(f"resuming {found.path.name} with changed settings, applied from step {start + 1}: {', '.join(changes)}")
    return start


def write_summary(cfg: RunConfig, out: Path, rank: int, world_size: int, global_batch: int, start: int,
                  plan: ParallelPlan, metrics: Metrics, guard: NonFiniteGuard, samples_skipped: Any,
                  init: dict[str, Any] | None, tokenizer: dict[str, str] | None, fam: Family, mcfg: Any,
                  params: int) -> dict[str, Any]:
    """The run's summary (observe/summary.py) with what this run skipped, validated and loaded;
    rank 0 writes summary.json and prints it."""
    summary = run_summary(metrics.history, dict(metrics.losses), world_size=world_size, global_batch=global_batch,
                          start_step=start, info={"family": cfg.model.family, "parallel_applied": plan.applied,
                                                  **model_shape(fam, cfg.model.preset, cfg.model.overrides, mcfg, params)})
    summary["nonfinite_skipped"] = guard.skipped
    summary["samples_skipped"] = samples_skipped  # dropped by the loader for a bad shard
    summary["evals"] = metrics.evals  # validation records (validation.py), the last also as val_loss
    summary["val_loss"] = metrics.evals[-1]["val_loss"] if metrics.evals else None
    summary["init_from"] = init  # format, tensors, load seconds of model.init_from (None: random init or resumed)
    summary["tokenizer"] = tokenizer  # {"name", "from"}; None: the family has no prompt tokenizer
    if guard.skipped:
        n = len(guard.skipped)
        say(f"skipped {n} non-finite step{'s' if n > 1 else ''} (train.on_nonfinite=\"skip\"): steps "
            f"{', '.join(str(s + 1) for s in guard.skipped)}")  # the k-th step; summary.json keeps indexes
    if rank == 0:
        write_atomic(out / "summary.json", (json.dumps(summary, indent=1) + "\n").encode())
        print(format_summary(summary), flush=True)
    return summary


def checkpoint_due(out: OutputConfig, done: int, steps: int, *, stopping: bool) -> bool:
    """Whether the state after `done` of `steps` steps is saved: every output.checkpoint_every steps,
    and with output.save_last the last step and a SIGTERM's step (a run that checkpoints every N
    saves a SIGTERM's step anyway: its rerun would otherwise redo up to N - 1 steps)."""
    if out.checkpoint_every and done % out.checkpoint_every == 0:
        return True
    if stopping:
        return bool(out.checkpoint_every or out.save_last)
    return done == steps and out.save_last


def stopped(done: int, steps: int, saved: Path | None, signum: int) -> Stopped:
    """The one line of a run stopped by `signum` after `done` steps (the same on every rank)."""
    then = (f"checkpoint {saved} written: rerun the same command to resume from it" if saved is not None else
            "no checkpoint (output.save_last=false, output.checkpoint_every=0): a rerun starts over")
    name = "SIGINT (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
    return Stopped(signum, f"stopped by {name} after {done} of {steps} steps; {then}")


def say(message: str) -> None:
    """One line to the user on stderr, from rank 0 (resume notes, skipped steps)."""
    if world()[0] == 0:
        print(f"trainkit: {message}", file=sys.stderr, flush=True)


def init_process_group(device: torch.device, world_size: int, *, needed: bool) -> None:
    """torchrun's group (env://), or a one-process group so FSDP also runs without torchrun."""
    if dist.is_initialized() or not (needed or world_size > 1):
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
