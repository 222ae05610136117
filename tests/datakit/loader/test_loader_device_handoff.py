"""The device batcher's hand-over between its feeder thread and `next()` (`gpu_batch._cuda`),
run on a CPU machine with the CUDA calls it makes replaced by stand-ins that record what they
were asked: batches come out whole and in order, each one after its stream waited on its event,
the loader's bookkeeping in order; a caller that switches streams gets the wait on its new
stream; a feeder error reaches the caller. (The copy itself is tested on a GPU in test_loader_loans.)"""
from __future__ import annotations

import types

import pytest
import torch

from datakit.loader import gpu_batch
from datakit.loader.config import LoaderConfig
from datakit.loader.normalise import Normaliser


class Event:
    def record(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True


class Stream:
    handles = iter(range(1000, 2000))

    def __init__(self, device=None, **_):
        self.cuda_stream = next(Stream.handles)
        self.waited: list[Event] = []

    def wait_event(self, ev: Event) -> None:
        self.waited.append(ev)


class StreamContext:
    def __init__(self, stream) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> bool:
        return False


@pytest.fixture
def cuda(monkeypatch):
    """The stand-ins; `cuda.current` is the caller's current stream (switch it by assignment)."""
    state = types.SimpleNamespace(current=Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: state.current)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: state.current.cuda_stream, raising=False)
    return state


def _batcher() -> gpu_batch.DeviceBatcher:
    cfg = LoaderConfig(batch_size=4)
    mean, std = torch.tensor(cfg.image_mean), torch.tensor(cfg.image_std)
    affine = (torch.full((3,), 0.5), torch.ones(3))
    norm = Normaliser(cfg=cfg, layout="rgb", image_scale=1.0 / (255.0 * std), image_bias=-mean / std,
                      state_affine=affine, action_affine=affine)
    b = gpu_batch.DeviceBatcher(norm, "cpu", depth=2, pin_memory=False)
    b.device = torch.device("cuda", 0)  # the CUDA path, on CPU tensors

    def launch(self, hb, ring, copy_stream, consumer):  # the copy and normalisation, on the CPU
        meta = {k: hb[k] for k in gpu_batch.HOST_KEYS if k in hb}
        out = self.normaliser({k: v for k, v in hb.items() if k not in meta}, epoch=int(hb["epoch"]),
                              step=int(hb["step"]))
        return {**out, **meta}, Event(), tuple(int(hb[k]) for k in gpu_batch.HOST_KEYS)
    b._launch = types.MethodType(launch, b)
    return b


def _host(n: int, fail_at: int | None = None):
    g = torch.Generator().manual_seed(0)
    for s in range(n):
        if s == fail_at:
            raise ValueError("shard-000001.tar: bad member")
        yield {"images": torch.randint(0, 256, (4, 2, 1, 8, 8, 3), dtype=torch.uint8, generator=g),
               "state": torch.randn(4, 3, generator=g), "action": torch.randn(4, 5, 3, generator=g),
               "epoch": torch.tensor(0), "step": torch.tensor(s), "num_skipped": torch.tensor(s % 2)}


def test_batches_whole_in_order_each_after_its_wait(cuda):
    b = _batcher()
    taken = []
    got = list(b(_host(7), on_take=lambda *m: taken.append(m)))
    want = [b.normaliser(hb, epoch=0, step=s) for s, hb in enumerate(_host(7))]
    assert [int(x["step"]) for x in got] == list(range(7))
    for g, w in zip(got, want):
        for k in ("images", "state", "action"):
            assert torch.equal(g[k], w[k]), k
    assert taken == [(0, s, s % 2) for s in range(7)]
    assert len(cuda.current.waited) == 7


def test_a_caller_that_switches_streams_waits_on_its_new_stream(cuda):
    it = _batcher()(_host(6))
    first = cuda.current
    for _ in range(3):
        next(it)
    cuda.current = Stream()
    rest = list(it)
    assert len(first.waited) == 3 and len(cuda.current.waited) == 3 and len(rest) == 3


def test_a_feeder_error_reaches_the_caller(cuda):
    it = _batcher()(_host(5, fail_at=2))
    assert [int(next(it)["step"]) for _ in range(2)] == [0, 1]
    with pytest.raises(ValueError, match="shard-000001.tar"):
        next(it)


def test_gil_switch_interval_sets_and_restores():
    """The trainer's data.gil_switch_ms: set inside the block, the interpreter's own back after (also
    when the block raises); 0 leaves the interval alone."""
    import sys

    import pytest

    from datakit.loader.gpu_batch import gil_switch_interval

    before = sys.getswitchinterval()
    with gil_switch_interval(0.0005):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == before
    with pytest.raises(RuntimeError):
        with gil_switch_interval(0.001):
            raise RuntimeError("a failed step")
    assert sys.getswitchinterval() == before
    with gil_switch_interval(0.0):
        assert sys.getswitchinterval() == before
