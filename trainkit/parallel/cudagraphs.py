"""CUDA graphs of the trained micro-batch: forward + backward captured once per batch shape and
replayed, with or without FSDP2, on any world size.

    step = micro_step(model, cast, accum, graphs=plan.cuda_graphs, per_item=mixture)
    loss, items = step(batch)   # forward, (loss / accum).backward(): gradients in .grad; items: (B,) or None
    step.zero_grad(opt)         # after the optimiser step

What one graph holds, in launch order: the copy-in of the batch into the graph's static inputs is
NOT in it (it runs just before the replay); the graph is the whole forward (FSDP2's pre-forward
hooks, the all-gather copy-in/out of every unit, the frozen part under no_grad, the trained
blocks, the loss) and the whole backward (the blocks' gradients, FSDP2's reduce-scatters into the
sharded gradients and their accumulation, or autograd's accumulation without FSDP). NCCL kernels
are captured like any other (NCCL >= 2.9.6); FSDP2's side streams join the capture because its
root pre-forward and its reduce waits make them wait on the capturing stream, and re-join it before
the backward ends. Outside the graph: gradient clipping, the optimiser step, the schedule,
zeroing the gradients (in place: the graph adds into the gradient tensors it captured), the data
copy and metrics.

Why it is correct to replay: every address the graph touches stays put between replays: the
parameters (optimisers update them in place), their sharded gradients (allocated before the
capture and zeroed in place by `zero_grad(set_to_none=False)`), the static batch, and FSDP2's
unsharded parameters and buffers, which are allocated and freed inside the capture and so live in
the graph's private memory pool. Random draws are not in the graph: a family's batch carries its
flow noise and time, drawn on the host from the batch's own generator (data.flow_generator), so a
replay sees the new batch's draws; a model must not draw random numbers in forward (no dropout).

Capture: on the first batch of a shape (image slots can change it), the gradients accumulated so
far are saved, the step runs `WARMUP` times eagerly on a side stream (torch.compile compiles,
cuBLAS and FSDP2 initialise lazily, so nothing is first-run inside the capture), the gradients are
restored, the step is captured and then replayed for that batch. The warm-up runs' gradients
are thereby discarded, so the training is the eager run's. A new shape gets its own graph (and
memory pool), at most `MAX_GRAPHS`; beyond that the step runs eagerly.

Measured (one H200, GR00T N1.6 at micro-batch 16, FSDP2 per block, compiled blocks;
bench/results/gr00t_h200.md): 52.9 samples/s eager -> 167.2 with the graph (3.2x); the graphed run's
losses follow the eager run's to 0.012 over 14 bf16 steps, as closely as the eager run follows the
baseline's (0.016). Without FSDP (one rank, `parallel.fsdp_one_rank = false`, autocast, blocks not
compiled) at the probe's 50-action shapes: 146.0 samples/s. World size 2 has not run on a GPU (one GPU was lent); the capture holds
FSDP2's NCCL reduce-scatters and all-gathers there, which NCCL supports in graphs.

Not captured, and why: the optimiser step (fused AdamW over FSDP2's DTensors dispatches in Python
per step, and a capturable AdamW would need its step counts on the device); the gradient norm
(its result decides on the host whether the step is applied: trainkit/optim/nonfinite.py). CPU runs
have no graphs: `parallel.cuda_graphs` is refused there (parallelize).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
import torch.nn as nn

WARMUP = 2  # eager runs of a new shape before its capture
MAX_GRAPHS = 4  # shapes captured at most (each holds its own memory pool)


def micro_step(model: nn.Module, cast: contextlib.AbstractContextManager, accum: int, *, graphs: bool,
               per_item: bool = False, grads: str = "zeroed") -> "EagerStep":
    """The trainer's forward + backward of one micro-batch (of `accum` per optimiser step): eager,
    or through CUDA graphs; `per_item`: the model's per-item losses too (`model(batch, per_item=True)`,
    the per-source loss of a mixture); `grads` (parallel.graph_grads): "owned" lets a graph without
    accumulation write its gradients into tensors of its own pool (`OwnedGradStep`); "owned_first"
    does so with accumulation too: a step's first micro-batch writes them, the others add into them
    (`FirstWritesStep`)."""
    if not graphs:
        return EagerStep(model, cast, accum, per_item)
    if grads == "owned_first" and accum > 1:
        return FirstWritesStep(model, cast, accum, per_item)
    owned = grads in ("owned", "owned_first") and accum == 1
    return (OwnedGradStep if owned else GraphedStep)(model, cast, accum, per_item)


class EagerStep:
    """forward, (loss / accum).backward(); `zero_grad` after the optimiser step sets grads to None."""

    def __init__(self, model: nn.Module, cast: contextlib.AbstractContextManager, accum: int, per_item: bool = False):
        self.model, self.cast, self.scale, self.per_item = model, cast, 1.0 / accum, per_item

    def run(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the loss, detached; the (B,) per-item losses, or None without `per_item`)."""
        with self.cast:
            loss, items = self.model(batch, per_item=True) if self.per_item else (self.model(batch), None)
        (loss * self.scale).backward()
        return loss.detach(), items

    __call__ = run

    def zero_grad(self, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=True)


def _tensors(batch: Any) -> dict[str, torch.Tensor]:
    """The tensor fields of a family's batch (a dataclass)."""
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)}


def signature(batch: Any) -> tuple:
    """What a graph is specialised to: every field's shape and dtype, and every non-tensor field."""
    return tuple((f.name, tuple(v.shape), v.dtype) if isinstance(v := getattr(batch, f.name), torch.Tensor)
                 else (f.name, v) for f in dataclasses.fields(batch))


@dataclasses.dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]  # static batch tensors, filled before each replay
    loss: torch.Tensor  # static output, rewritten by each replay
    items: torch.Tensor | None  # static per-item losses (per_item), rewritten by each replay
    grads: list[torch.Tensor] | None = None  # OwnedGradStep: the gradients the graph writes, in its pool


class GraphedStep(EagerStep):
    """forward + backward of a micro-batch replayed from a CUDA graph per batch shape (module
    docstring). The graph adds into gradients allocated before it, so they are zeroed in place."""

    def __init__(self, model: nn.Module, cast: contextlib.AbstractContextManager, accum: int, per_item: bool = False):
        super().__init__(model, cast, accum, per_item)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.graphs: dict[tuple, _Graph] = {}
        self.captures = 0  # graphs captured
        self.eager_steps = 0  # micro-batches run eagerly because MAX_GRAPHS shapes were taken

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        key = signature(batch)
        g = self.graphs.get(key)
        if g is None:
            if len(self.graphs) >= MAX_GRAPHS:
                self.eager_steps += 1
                return self.run(batch)
            g = self.graphs[key] = self._capture(batch)
        for name, t in _tensors(batch).items():
            g.inputs[name].copy_(t, non_blocking=True)
        if g.grads is not None:  # this graph's gradient tensors (another shape's graph has its own)
            for p, grad in zip(self.params, g.grads):
                p.grad = grad
        g.graph.replay()
        return g.loss, g.items

    def zero_grad(self, opt: torch.optim.Optimizer) -> None:
        opt.zero_grad(set_to_none=False)  # in place: the graph adds into these tensors

    def _warm_up(self, static: Any) -> None:
        """`WARMUP` eager runs on a side stream (compiles and lazy initialisation happen outside the capture)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                self.run(static)
        torch.cuda.current_stream().wait_stream(side)

    def _capture(self, batch: Any, pool: Any = None) -> _Graph:
        """A graph adding into the gradients there are (made zero where none are); `pool`: share that
        graph memory pool."""
        for p in self.params:  # the graph accumulates into these: they must exist before it
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        saved = [p.grad.detach().clone() for p in self.params]
        inputs = {name: t.clone() for name, t in _tensors(batch).items()}
        static = dataclasses.replace(batch, **inputs)
        self._warm_up(static)
        with torch.no_grad():
            for p, g in zip(self.params, saved):
                p.grad.copy_(g)
        del saved
        graph = torch.cuda.CUDAGraph()
        # thread_local: the loader's copy thread keeps working on its own stream meanwhile; the
        # autograd engine's device thread launches the backward onto the capturing stream
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            loss, items = self.run(static)
        self.captures += 1
        return _Graph(graph=graph, inputs=inputs, loss=loss, items=items)


class OwnedGradStep(GraphedStep):
    """A graph without gradient accumulation (accum 1) that owns its gradients: they are None when it
    is captured, so autograd's AccumulateGrad allocates each one inside the capture (in the graph's
    private pool) and assigns it, and every replay writes it afresh. No zeroing after the optimiser
    step and no add into zeros during backward: GR00T N1.7 at micro-batch 16 without FSDP spent
    ~5.9 ms a step in 442 float adds and 1.9 ms in zeroing (of an 88 ms step, one H100,
    ../shared/gpu-runs/h100-9a836f8/gr00t_candidates.json). x + 0 == x, so the losses are the
    zeroed graph's bit for bit. The tensors stay referenced by the graph record (and are handed back
    to .grad before each replay), so their memory is never given to anything else."""

    def zero_grad(self, opt: torch.optim.Optimizer) -> None:
        """Nothing: the next replay overwrites every gradient (the optimiser has read them)."""

    def _capture(self, batch: Any) -> _Graph:
        inputs = {name: t.clone() for name, t in _tensors(batch).items()}
        static = dataclasses.replace(batch, **inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                for p in self.params:
                    p.grad = None
                self.run(static)
        torch.cuda.current_stream().wait_stream(side)
        for p in self.params:  # the warm-up's gradients are discarded (accum 1: nothing earlier to keep)
            p.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            loss, items = self.run(static)
        missing = [i for i, p in enumerate(self.params) if p.grad is None]
        if missing:  # a trained parameter the loss does not reach: give it a zero gradient, as zeroed graphs have
            for i in missing:
                self.params[i].grad = torch.zeros_like(self.params[i])
        self.captures += 1
        return _Graph(graph=graph, inputs=inputs, loss=loss, items=items, grads=[p.grad for p in self.params])


class FirstWritesStep(GraphedStep):
    """Graphs with gradient accumulation whose first micro-batch of a step writes the gradients
    instead of adding into zeros: a "first" graph captured with no gradients (autograd's
    AccumulateGrad takes the incoming gradient buffers, in the graph's pool, as .grad, as
    `OwnedGradStep` does) and a "rest" graph captured adding into exactly those tensors, sharing the
    first graph's memory pool (replayed one after the other, never at once). It drops one fp32 add
    per trained parameter and the zeroing per step: Pi0.5 at 12 x 4 on one H100 spent 54 ms of a 919
    ms step in 2227 gradient adds (bench/results/pi05_h100.md), a quarter of them into zeros. One batch
    shape is graphed (the first one's); another shape's micro-batches run eagerly into the same
    gradient tensors (zeroed in place on a step's first). x + 0 == x: the losses are the zeroed
    graphs' bit for bit."""

    def __init__(self, model: nn.Module, cast: contextlib.AbstractContextManager, accum: int, per_item: bool = False):
        super().__init__(model, cast, accum, per_item)
        self.accum = accum
        self.micro = 0  # this call's micro-batch within its step
        self.shape: tuple | None = None  # the graphed batch shape
        self.grads: list[torch.Tensor] | None = None  # the gradient tensors every micro-batch writes or adds into

    def __call__(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        first, self.micro = self.micro == 0, (self.micro + 1) % self.accum
        key = signature(batch)
        if self.shape is None:
            self.shape = key
        if key != self.shape:
            self.eager_steps += 1
            return self._eager(batch, first)
        role = "first" if first else "rest"
        g = self.graphs.get(role)
        if g is None:
            g = self.graphs[role] = self._capture_first(batch) if first else self._capture_rest(batch)
        for name, t in _tensors(batch).items():
            g.inputs[name].copy_(t, non_blocking=True)
        if first:
            for p, grad in zip(self.params, self.grads):
                p.grad = grad
        g.graph.replay()
        return g.loss, g.items

    def zero_grad(self, opt: torch.optim.Optimizer) -> None:
        """Nothing to zero: the next step's first micro-batch overwrites the gradients."""
        self.micro = 0

    def _eager(self, batch: Any, first: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Another shape than the graphed one, eagerly, into the same gradients (the graphed shape is
        the first call's, so they exist)."""
        for p, grad in zip(self.params, self.grads):
            if first:
                grad.zero_()
            p.grad = grad
        return self.run(batch)

    def _capture_first(self, batch: Any) -> _Graph:
        """`OwnedGradStep`'s capture: the gradients it writes become the ones every micro-batch uses."""
        g = OwnedGradStep._capture(self, batch)
        self.grads = g.grads
        return g

    def _capture_rest(self, batch: Any) -> _Graph:
        """Captured adding into the first graph's gradients (this step's, kept across the warm-up), in
        its memory pool."""
        for p, grad in zip(self.params, self.grads):
            p.grad = grad
        g = self._capture(batch, pool=self.graphs["first"].graph.pool())
        if any(p.grad is not grad for p, grad in zip(self.params, self.grads)):
            raise RuntimeError("a CUDA graph of a later micro-batch did not add into the first one's gradients")
        return g
