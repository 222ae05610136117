"""parallel.graph_grads (trainkit/parallel/cudagraphs.py): "owned" gradients of a CUDA graph
against the zeroed ones it replaces.

CPU: which step class each setting picks (owned only without accumulation). CUDA (skipped
elsewhere): a small model trained 6 steps with fused AdamW through the zeroed graph and through
the owned one, from the same weights and batches: the same losses and weights bit for bit (x + 0
== x), a parameter the loss does not reach included; the positive control replays the owned graph
without handing its gradients back and must differ.
"""
import contextlib
import copy
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

from trainkit.parallel.cudagraphs import EagerStep, FirstWritesStep, GraphedStep, OwnedGradStep, micro_step


@dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 8)
        self.unused = nn.Linear(4, 4)  # trained, never reached by the loss

    def forward(self, batch: Batch) -> torch.Tensor:
        return ((self.b(torch.relu(self.a(batch.x))) - batch.y) ** 2).mean()


def test_owned_is_picked_only_without_accumulation():
    net, cast = Net(), contextlib.nullcontext()
    assert type(micro_step(net, cast, 1, graphs=False, grads="owned")) is EagerStep
    assert type(micro_step(net, cast, 1, graphs=True, grads="owned")) is OwnedGradStep
    assert type(micro_step(net, cast, 2, graphs=True, grads="owned")) is GraphedStep
    assert type(micro_step(net, cast, 1, graphs=True)) is GraphedStep


def test_owned_first_writes_on_the_first_micro_batch_only_with_accumulation():
    net, cast = Net(), contextlib.nullcontext()
    assert type(micro_step(net, cast, 3, graphs=True, grads="owned_first")) is FirstWritesStep
    assert type(micro_step(net, cast, 1, graphs=True, grads="owned_first")) is OwnedGradStep
    assert type(micro_step(net, cast, 3, graphs=False, grads="owned_first")) is EagerStep


def _train(net: nn.Module, step_cls: type, batches: list[Batch], hand_back: bool = True) -> tuple[list[float], list]:
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, fused=True)
    step = step_cls(net, contextlib.nullcontext(), 1)
    losses = []
    for i, b in enumerate(batches):
        if not hand_back and i > 2:  # positive control: .grad no longer the tensors the graph writes
            for g in step.graphs.values():
                g.grads = None
            for p in net.parameters():
                p.grad = torch.zeros_like(p)
        loss, _ = step(b)
        opt.step()
        step.zero_grad(opt)
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in net.parameters()]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_owned_gradients_train_like_zeroed_ones_bit_for_bit():
    torch.manual_seed(0)
    net = Net().cuda()
    batches = [Batch(torch.randn(16, 32, device="cuda"), torch.randn(16, 8, device="cuda")) for _ in range(6)]
    zeroed, w_zeroed = _train(copy.deepcopy(net), GraphedStep, batches)
    owned, w_owned = _train(copy.deepcopy(net), OwnedGradStep, batches)
    assert zeroed == owned
    assert all(torch.equal(a, b) for a, b in zip(w_zeroed, w_owned))
    broken, _ = _train(copy.deepcopy(net), OwnedGradStep, batches, hand_back=False)
    assert broken != owned


def _train_accum(net: nn.Module, step_cls: type, batches: list[Batch], accum: int, hand_back: bool = True):
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2, fused=True)
    step = step_cls(net, contextlib.nullcontext(), accum)
    losses = []
    for i in range(0, len(batches), accum):
        if not hand_back and i >= 2 * accum:  # positive control: .grad no longer the tensors the graphs use
            step.grads = [torch.zeros_like(p) for p in net.parameters()]
        total = 0.0
        for b in batches[i:i + accum]:
            loss, _ = step(b)
            total += loss.item() / accum
        opt.step()
        step.zero_grad(opt)
        losses.append(total)
    return losses, [p.detach().clone() for p in net.parameters()]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_first_writes_gradients_train_like_zeroed_ones_bit_for_bit():
    """parallel.graph_grads = "owned_first" with accumulation 3: the first micro-batch's graph writes
    the gradients, the two others add; the same losses and weights as zeroed graphs, bit for bit, a
    parameter the loss does not reach included, and a batch of another shape run eagerly on the way.
    Control: gradients swapped for other tensors after two steps must train otherwise."""
    torch.manual_seed(0)
    net = Net().cuda()
    batches = [Batch(torch.randn(16, 32, device="cuda"), torch.randn(16, 8, device="cuda")) for _ in range(18)]
    batches[10] = Batch(torch.randn(12, 32, device="cuda"), torch.randn(12, 8, device="cuda"))  # another shape
    zeroed, w_zeroed = _train_accum(copy.deepcopy(net), GraphedStep, batches, 3)
    first, w_first = _train_accum(copy.deepcopy(net), FirstWritesStep, batches, 3)
    assert zeroed == first
    assert all(torch.equal(a, b) for a, b in zip(w_zeroed, w_first))
    broken, _ = _train_accum(copy.deepcopy(net), FirstWritesStep, batches, 3, hand_back=False)
    assert broken != first
