"""What a step with a NaN or inf loss or gradient norm does: `train.on_nonfinite`.

    guard = NonFiniteGuard(cfg.train.on_nonfinite, device)
    guard.add(rows, batch.actions)                        # each micro-batch of the step
    if guard.step_ok(step, loss, grad_norm, params):      # before opt.step(); "stop" raises NonFiniteError
        opt.step()

- "stop" (default): the run ends with one line naming the step, its loss and grad norm, the ranks
  that saw a non-finite loss, this rank's batch rows and, among them, the rows whose actions are
  non-finite (shards converted with `--nonfinite keep`).
- "skip": the step is left out (no optimiser update, no metrics line) and counted (`skipped`,
  written to summary.json and said at the end). The schedule and the sample order move on as if it
  had been taken, so a resume lines up. Skipping cannot rescue a run that has diverged, so the run
  stops too when the weights themselves are non-finite, or after `CONSECUTIVE_LIMIT` non-finite
  steps in a row (a huge lr leaves the weights finite but every loss NaN).
- A state holding NaN/inf cannot be tokenized into the prompt; it stops the run with the same one
  line in either mode (`data_error`).
Before every checkpoint `check_state` refuses to save non-finite weights or Adam moments, so no
checkpoint is ever non-finite.

`step` arguments are the trainer's 0-based step index (metrics.jsonl's "step", `skipped`); the
messages say the k-th step, `step k`, as the terminal's step lines and the checkpoint names count.

Cost: with `train.nonfinite_check = "sync"`, one host sync per step (the decision must come before
`opt.step()`): the GPU may idle while the host then launches the optimiser step (Pi0.5 `full` on
one H200 at micro-batch 40: the same 54.4 samples/s either way; its idle time is elsewhere). With several ranks, an all-reduce of
one flag per rank, so every rank takes the same decision (a rank's loss is its own; the grad norm
is global) and knows which ranks saw a non-finite loss. The same all-reduce carries each rank's
request to stop (a SIGTERM or SIGINT, trainkit/train.py), so all ranks stop together.

`train.nonfinite_check = "deferred"` takes the same decision without the sync: the update of a
non-finite step is skipped on the device (fused AdamW's `found_inf`, the flag GradScaler uses; the
EMA update is weighted by it too), the flags go to pinned host memory behind an event, and the host
reads step N's verdict while step N+1 runs (`settle()`, also before every metrics flush and
checkpoint). What changes: "stop" raises one step later (naming step N; step N changed no weight),
a skipped step's metrics record is dropped at the next settle, and a SIGTERM or SIGINT stops one step later.
"""
from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from trainkit.errors import BatchDataError, NonFiniteError
from trainkit.parallel.ranks import rank_world

_STOP = 'train.on_nonfinite="stop" ("skip" leaves such steps out)'
CONSECUTIVE_LIMIT = 10  # non-finite steps in a row that "skip" takes for divergence, not bad batches


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _all_finite(tensors: list[torch.Tensor], device: torch.device) -> bool:
    """Every element of every (local shard of a) tensor is finite, on every rank."""
    # .to(device): Adam's step counts may live on the CPU beside CUDA weights
    flags = [torch.isfinite(_local(t)).all().to(device) for t in tensors if t.is_floating_point()]
    ok = torch.stack(flags).all().float().to(device) if flags else torch.ones((), device=device)
    if dist.is_initialized():
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


@dataclass
class _Pending:
    """A deferred step's verdict, on its way to the host."""

    step: int
    host: torch.Tensor  # the all-reduced flags, copied to (pinned) host memory behind `event`
    event: torch.cuda.Event | None  # None on a CPU (the copy was synchronous)
    micro: list[tuple[torch.Tensor, torch.Tensor]]  # the step's (rows, actions) per micro-batch
    loss: torch.Tensor
    grad_norm: torch.Tensor


class NonFiniteGuard:
    """Per step: collects the micro-batches' rows and actions, then decides whether the step is applied
    (`deferred`: on the device, read by the host a step later; `on_skip(step)` then drops its record)."""

    def __init__(self, mode: str, device: torch.device, *, deferred: bool = False,
                 on_skip: Callable[[int], None] | None = None):
        self.mode, self.device, self.deferred, self.on_skip = mode, device, deferred, on_skip
        self.rank, self.world = rank_world()
        self.skipped: list[int] = []  # steps left out under "skip"
        self._run = 0  # non-finite steps in a row
        self._micro: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.mean_loss = torch.zeros(())  # the last checked step's loss, averaged over ranks
        self.stop_signal = 0  # the signal some rank was asked to stop by at the last checked step (0: none)
        self.skip_flag: torch.Tensor | None = None  # deferred: 1.0 on the device when this step is skipped
        self._pending: _Pending | None = None

    def add(self, rows: torch.Tensor, actions: torch.Tensor) -> None:
        self._micro.append((rows, actions))

    def step_ok(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, params: list[nn.Parameter],
                stop: int = 0, opt: torch.optim.Optimizer | None = None) -> bool:
        """True: apply the step. False: skip it (counted). NonFiniteError under "stop", or when the
        parameters have diverged. `stop`: the signal this rank was asked to end the run by (SIGTERM,
        SIGINT; 0: none); afterwards `stop_signal` says whether any rank was, the same on every rank
        (SIGINT where any rank got one: the user's Ctrl-C names the exit code). Deferred: always True,
        `opt` (fused AdamW) skips the update on the device, and the previous step is settled."""
        micro, self._micro = self._micro, []
        # per-rank non-finite flags, the loss sum, the ranks asking to stop by SIGTERM, by SIGINT
        flags = torch.zeros(self.world + 3, device=self.device)
        flags[self.rank] = (~torch.isfinite(torch.stack([loss.detach().float(), grad_norm.detach().float()]))).any()
        flags[self.world] = loss.detach().float()
        flags[self.world + 1] = float(stop == signal.SIGTERM)
        flags[self.world + 2] = float(stop == signal.SIGINT)
        if dist.is_initialized() and self.world > 1:
            dist.all_reduce(flags)  # the one collective of the check also averages the loss over ranks
        self.mean_loss = flags[self.world] / self.world
        if not self.deferred:
            return self._decide(step, flags.tolist(), micro, loss, grad_norm, params)
        if opt is None:
            raise ValueError("a deferred check needs the optimiser (its found_inf skips the update)")
        self.skip_flag = (flags[:self.world] > 0).any().float()
        opt.found_inf = self.skip_flag  # read by fused AdamW's step: no update, step counts unchanged
        cuda = self.device.type == "cuda"
        host = torch.empty(flags.shape, dtype=flags.dtype, pin_memory=cuda)
        host.copy_(flags, non_blocking=cuda)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        previous = self._pending
        self._pending = _Pending(step, host, event, micro, loss.detach(), grad_norm.detach())
        if previous is not None:
            self._settle(previous, params)
        return True

    def settle(self, params: list[nn.Parameter]) -> None:
        """Deferred: read the last step's verdict now (before a metrics flush, a checkpoint, the end)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._settle(pending, params)

    def _settle(self, p: _Pending, params: list[nn.Parameter]) -> None:
        if p.event is not None:
            p.event.synchronize()  # long done: the host is a step ahead of it
        try:
            applied = self._decide(p.step, p.host.tolist(), p.micro, p.loss, p.grad_norm, params)
        except NonFiniteError:
            applied = False
            raise
        finally:
            if not applied and self.on_skip:  # its metrics record is already there: no line for it
                self.on_skip(p.step)

    def _decide(self, step: int, values: list[float], micro: list[tuple[torch.Tensor, torch.Tensor]],
                loss: torch.Tensor, grad_norm: torch.Tensor, params: list[nn.Parameter]) -> bool:
        self.stop_signal = signal.SIGINT if values[self.world + 2] > 0 else signal.SIGTERM if values[self.world + 1] > 0 else 0
        bad_ranks = [r for r, f in enumerate(values[:self.world]) if f]
        self._run = self._run + 1 if bad_ranks else 0
        if not bad_ranks:
            return True
        diverged = ""
        if self.mode == "skip":
            if self._run >= CONSECUTIVE_LIMIT:
                diverged = f"; {self._run} non-finite steps in a row: the run has diverged (lower optim.lr?)"
            elif not _all_finite(list(params), self.device):
                diverged = "; the weights are non-finite, skipping cannot help (lower optim.lr?)"
            else:
                self.skipped.append(step)
                return False
        rows = [int(r) for rows, _ in micro for r in rows.tolist()]
        bad_rows = [int(r) for rows, actions in micro
                    for r in rows[~torch.isfinite(actions).flatten(1).all(1).to(rows.device)].tolist()]
        where = f"non-finite actions in rows {bad_rows}" if bad_rows else "no non-finite action in them"
        mode = _STOP if self.mode == "stop" else 'train.on_nonfinite="skip"'
        raise NonFiniteError(f"step {step + 1}: non-finite loss {loss.item():g} or grad norm {grad_norm.item():g} "
                             f"on ranks {bad_ranks}; rank {self.rank}'s batch rows {rows}, {where}{diverged}; {mode}")

    def data_error(self, step: int, err: BatchDataError) -> NonFiniteError:
        """The one line for a batch the loader could not build (a NaN/inf state)."""
        return NonFiniteError(f"step {step + 1}: {err} on rank {self.rank}; the prompt cannot be built from it "
                              f"(in either train.on_nonfinite mode): convert without --nonfinite keep, or fix the data")


def check_state(step: int, model: nn.Module, opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Refuse to checkpoint non-finite weights or optimiser moments (collective)."""
    tensors = [p.detach() for p in model.parameters()]
    tensors += [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    if not _all_finite(tensors, device):
        raise NonFiniteError(f"step {step + 1}: the weights or optimiser moments are non-finite; no checkpoint saved "
                             f"(lower optim.lr?)")
