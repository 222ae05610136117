"""Resuming with another world size: a job that ran k global steps on W ranks, saved the
loader state and resumed on W' ranks (and/or another per-rank batch, with micro-batches making
up the same global batch) continues the same global order.

Oracle: a brute-force walk over `epoch_order` (the epoch's permutation, shared by every split):
global step g of an unbroken run reads the g-th run of `global_batch` positions of the
concatenated epochs, each epoch cut to a whole number of global batches. For each global
step, the union of what all ranks of the resumed job read (over its micro-batches) must equal
that set; on the real loader the positions are the frame-table rows (`batch["row"]`).
"""
import numpy as np
import pytest

from datakit.loader import LoaderConfig, ShardLoader
from datakit.loader.dataset import ShardDataset
from datakit.loader.sampler import StepSampler, block_ids, epoch_order
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture


def oracle_steps(n: int, global_batch: int, steps: int, *, seed: int, mode: str,
                 blocks: np.ndarray | None = None) -> list[set[int]]:
    """Positions of global steps 0..steps-1 of an unbroken run, one epoch after another."""
    per_epoch = n // global_batch * global_batch
    flat: list[int] = []
    epoch = 0
    while len(flat) < steps * global_batch:
        flat += epoch_order(n, seed=seed, epoch=epoch, mode=mode, blocks=blocks)[:per_epoch].tolist()
        epoch += 1
    return [set(flat[g * global_batch:(g + 1) * global_batch]) for g in range(steps)]


def run_sampler(samplers: list[StepSampler], global_steps: int) -> list[set[int]]:
    """Every rank's batches, grouped by global step (micro-batches of one step merged)."""
    accum = samplers[0].epoch_batch // samplers[0].global_batch
    steps = []
    for _ in range(global_steps):
        got: list[int] = []
        for _ in range(accum):
            for s in samplers:
                got += s.batch(s.epoch, s.step).tolist()
                s.advance()
        assert len(got) == len(set(got))  # ranks and micro-batches never overlap
        steps.append(set(got))
    return steps


@pytest.mark.parametrize("mode", ["random", "shard_block"])
@pytest.mark.parametrize("world, batch", [(1, 12), (4, 3), (1, 4), (3, 2), (6, 1)])
def test_sampler_resumed_on_another_split_continues_the_global_order(mode, world, batch):
    n, gb, k, more = 100, 12, 11, 12  # 8 steps per epoch: the resume and the run cross epoch ends
    blocks = block_ids(np.repeat(np.arange(7), 15)[:n], 8) if mode == "shard_block" else None
    kw = dict(num_anchors=n, seed=5, mode=mode, blocks=blocks, epoch_batch=gb)
    first = [StepSampler(batch_size=6, rank=r, world_size=2, **kw) for r in range(2)]
    before = run_sampler(first, k)
    states = [s.state_dict() for s in first]
    assert states[0] == states[1]  # one global position, whatever the rank
    resumed = [StepSampler(batch_size=batch, rank=r, world_size=world, **kw) for r in range(world)]
    for s in resumed:
        s.load_state_dict(states[0])
    after = run_sampler(resumed, more)
    assert before + after == oracle_steps(n, gb, k + more, seed=5, mode=mode, blocks=blocks)


def test_resume_refuses_a_state_that_ends_mid_step_or_another_epoch_batch():
    s = StepSampler(num_anchors=100, batch_size=4, world_size=1, epoch_batch=12)
    s.advance()  # 4 samples: a third of a global batch of 12
    with pytest.raises(ValueError, match="not a whole step"):
        StepSampler(num_anchors=100, batch_size=12, epoch_batch=12).load_state_dict(s.state_dict())
    with pytest.raises(ValueError, match="epoch_batch=12 differs"):
        StepSampler(num_anchors=100, batch_size=4, epoch_batch=24).load_state_dict(s.state_dict())


def take(loader: ShardLoader, n: int) -> list[list[int]]:
    """The rows of the loader's next `n` batches, across epoch ends."""
    out: list[list[int]] = []
    while len(out) < n:
        for batch in loader:
            out.append(batch["row"].tolist())
            if len(out) == n:
                break
    return out


@pytest.mark.parametrize("world, batch", [(1, 8), (4, 2), (1, 4), (2, 2)])
def test_loader_saved_on_two_ranks_resumes_on_another_split(shards_rgb, world, batch):  # noqa: F811
    gb, k, more = 8, 7, 6  # 81 samples: 10 global steps per epoch, the resumed part crosses its end
    base = dict(seed=3, num_workers=0, epoch_batch=gb, pin_memory=False)
    ds = ShardDataset(shards_rgb, LoaderConfig(batch_size=gb, **base))
    first = [ShardLoader(shards_rgb, LoaderConfig(batch_size=4, rank=r, world_size=2, **base), dataset=ds)
             for r in range(2)]
    ranks = [take(loader, k) for loader in first]
    before = [set(ranks[0][g]) | set(ranks[1][g]) for g in range(k)]
    state = first[0].state_dict()
    assert state == first[1].state_dict()
    resumed = [ShardLoader(shards_rgb, LoaderConfig(batch_size=batch, rank=r, world_size=world, **base), dataset=ds)
               for r in range(world)]
    for loader in resumed:
        loader.load_state_dict(state)
    accum = gb // (world * batch)
    per_rank = [take(loader, more * accum) for loader in resumed]
    after = [set().union(*(per_rank[r][g * accum + m] for r in range(world) for m in range(accum)))
             for g in range(more)]
    want = [{int(ds.anchors[p]) for p in step} for step in oracle_steps(len(ds), gb, k + more, seed=3, mode="random")]
    assert before + after == want
    assert all(len(s) == gb for s in after)
