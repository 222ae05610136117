"""`ShardLoader`: the training-loop entry point, host batches in the global order, resumable.

    loader = ShardLoader("out/", LoaderConfig(batch_size=32, num_workers=4, rank=r, world_size=w))
    for batch in loader.device_batches(steps=max_steps):  # normalised, on the GPU (or CPU)
        ...
        ckpt["loader"] = loader.state_dict()     # (epoch, samples consumed): any world size resumes it

Under the hood it is a plain `torch.utils.data.DataLoader` over `ShardDataset` with our
`StepSampler` as `batch_sampler` (endless, so workers survive epoch ends); the DataLoader hands out batches in sampler order whatever
the number of workers. With workers, each reads its batches into a ring of shared-memory buffers
allocated once (`shm_pool`) and sends only the buffer id, so a 10 MB batch is not a new
shared-memory segment per step.

Host batches are lent, not copied (`LoaderConfig.lend_batches`, `loans`): `batch["images"]` is
the buffer the worker read into (without workers, a reused buffer of this process), and that
buffer is refilled only once no tensor refers to it - the batch, a slice, a `.numpy()` of it. So
a batch stays intact for as long as you hold any part of it, kept in a list or not; in the plain
`for batch in loader` loop the buffers cycle and no byte is copied (at 480x640 with 2 workers on
2 cores: 2.3x the items/s of copying, 131% of a one-thread page-cache read; bench/results/loader.md).
Holding many batches costs copies, not correctness: a worker's last free buffer is never lent.
`lend_batches=False` copies every batch into new memory.

The sampler's state advances only when a batch reaches the caller,
so batches prefetched before a checkpoint are produced again after a resume and a run
resumed at step k sees exactly the batches of an unbroken run from step k on.

On a remote root (`s3://...`) the batch sampler also drives the shard cache's downloads ahead
of the reads (`downloads.EpochDownloads`); `close()` stops them.

A worker outlives a SIGTERM by `WORKER_SIGTERM_GRACE_S` and ignores SIGINT (`_outlive_stop_signals`):
Slurm and `kill -TERM -PGID` signal every process of a job, a terminal's Ctrl-C every process of its
foreground group, and a worker ended at once would fail the step its trainer finishes before a
final checkpoint (torch raises "DataLoader worker is killed" or "exited unexpectedly" in the trainer
wherever it is). The trainer decides; its shutdown of the loader ends the workers as usual.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
import signal
from itertools import islice
from pathlib import Path

import torch
import torch.utils.data

from datakit.loader.config import LoaderConfig
from datakit.loader.dataset import ShardDataset, identity_collate
from datakit.loader.gpu_batch import DeviceBatcher, HostBatch, pin_host
from datakit.loader.loans import HostRing, Loans
from datakit.loader.mixture import MixtureSampler, MixtureSource, mixture_sources
from datakit.loader.mixture_dataset import MixtureDataset
from datakit.loader.normalise import Normaliser
from datakit.loader.features import FeatureDataset, open_dataset
from datakit.loader.downloads import EpochDownloads
from datakit.loader.sampler import StepSampler, block_ids
from datakit.loader.shm_pool import (BufferPool, PooledDataset, WorkerFailure, buffer_bytes_for, check_shm_space,
                                     pool_shape)


class _StepBatches:
    """The `batch_sampler`: a rank's batches from (epoch, step) on, across epochs, forever.

    One DataLoader (and its workers) then lives across epoch boundaries instead of being
    torn down and forked again at every epoch."""

    def __init__(self, sampler: StepSampler, epoch: int, step: int,
                 on_batch: Callable[[int, int], None] | None = None):
        self.sampler, self.epoch, self.step, self.on_batch = sampler, epoch, step, on_batch

    def __iter__(self) -> Iterator[list[int]]:
        epoch, step = self.epoch, self.step
        while True:
            for s, batch in enumerate(self.sampler.iter_epoch(epoch, step), start=step):
                if self.on_batch is not None:  # in the main process, ahead of the workers' reads
                    self.on_batch(epoch, s)
                yield batch
            epoch, step = epoch + 1, 0


class ShardLoader:
    """Deterministic, resumable batches of `ShardDataset` (or a `MixtureDataset`) for one rank.

    `root`: one shard folder (path or URL), or a weighted mixture of them: a path -> weight mapping or
    a sequence of `MixtureSource` (datakit/loader/mixture.py); `dataset`: the dataset of `root` as the
    caller already opened it."""

    def __init__(self, root: str | Path | Mapping[str, float] | Sequence[MixtureSource], cfg: LoaderConfig,
                 dataset: ShardDataset | MixtureDataset | FeatureDataset | None = None):
        self.cfg = cfg
        mixed = mixture_sources(root) if dataset is None else getattr(dataset, "sources", None)
        if dataset is None:
            if mixed:
                dataset = MixtureDataset(mixed, cfg)
            else:  # a feature folder (`datakit encode`) is read like shards, clip by clip
                dataset = open_dataset(root, cfg)
        self.dataset = ds = dataset
        # a mixture: one source of weight 1 for one folder, so `source` 0 always names something
        self.sources: tuple[MixtureSource, ...] = mixed or (MixtureSource(root=str(ds.root), weight=1.0),)
        if mixed:  # the schedule shuffles: the sampler walks global positions in order
            self.sampler: StepSampler = MixtureSampler(
                num_anchors=len(ds), batch_size=cfg.batch_size, mode="sequential", rank=cfg.rank,
                world_size=cfg.world_size, epoch_batch=cfg.epoch_batch, seed=cfg.seed)
        else:
            blocks = block_ids(ds.shard[ds.anchors], cfg.block_size) if cfg.shuffle == "shard_block" else None
            self.sampler = StepSampler(
                num_anchors=len(ds), batch_size=cfg.batch_size, seed=cfg.seed, mode=cfg.shuffle, rank=cfg.rank,
                world_size=cfg.world_size, drop_last=cfg.drop_last, blocks=blocks, epoch_batch=cfg.epoch_batch,
            )
        if cfg.num_workers:  # fail now, with what to raise, rather than with a SIGBUS mid-epoch
            workers, buffers, nbytes = pool_shape(cfg, ds)
            check_shm_space(workers * buffers * nbytes,
                            f"{workers} workers x {buffers} buffers x {nbytes / 2**20:.1f} MiB per batch")
        self.num_skipped = 0
        # remote root: download shards ahead of this rank's order
        # (a mixture's remote sources download each shard as a read first needs it)
        self.downloads = EpochDownloads(ds.cache, ds.shard[ds.anchors], self.sampler) \
            if not mixed and ds.cache else None
        self._host: tuple[tuple[int, int], Iterator[dict[str, torch.Tensor]]] | None = None

    def __len__(self) -> int:
        """Batches left in the current epoch."""
        return self.sampler.steps_per_epoch - self.sampler.step

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """The rest of the current epoch, as host uint8 batches; then the epoch rolls over."""
        s = self.sampler
        epoch = s.epoch
        while s.epoch == epoch:
            batch = self._next_host()
            self._delivered(batch)  # before the yield: a checkpoint taken now resumes after it
            yield batch

    def device_batches(self, device: torch.device | str | None = None, *, steps: int | None = None,
                       depth: int = 2, extras: Callable[[HostBatch], HostBatch] | None = None
                       ) -> Iterator[dict[str, torch.Tensor]]:
        """Normalised device batches from the current state on, across epochs (`steps` of them,
        or forever): copied from pinned buffers on a side stream, double-buffered.

        `extras(host_batch) -> host_batch`: the caller's per-batch host work (a trainer's prompt
        tokens, flow noise), run on each host batch before its copy, in the feeder thread on
        CUDA (so during the previous step); the tensors it adds travel with the batch and are
        not normalised. It may read `epoch` / `step` to seed its draws.

        Batches the device batcher prefetched do not count as delivered: the state advances
        when a batch is handed to the caller."""
        batcher = DeviceBatcher(self.normaliser(), device, depth=depth, pin_memory=self.cfg.pin_memory)
        start = (self.sampler.epoch, self.sampler.step)
        host = self._stream(*start, pin=batcher.pin)
        if extras is not None:
            host = map(extras, host)
        self._host = None  # the batcher owns this stream (it reads ahead)
        # islice: the batch after the last one wanted is never taken, so never counted delivered
        yield from islice(batcher(host, on_take=self._took), steps)

    def normaliser(self) -> Normaliser:
        """The device normaliser of this loader's batches (a mixture: each source's own statistics)."""
        ds = self.dataset
        if isinstance(ds, MixtureDataset):
            return Normaliser.from_sources(ds.indexes, self.cfg, ds.state_dim, ds.action_dim)
        return ds.normaliser()  # frames: the index's statistics; a feature folder: its own transform

    def _next_host(self) -> dict[str, torch.Tensor]:
        """The batch at the sampler's state, from a DataLoader kept alive while the caller
        consumes in order (a `load_state_dict` elsewhere restarts it at the new state)."""
        pos = (self.sampler.epoch, self.sampler.step)
        if self._host is None or self._host[0] != pos:
            self._host = (pos, self._stream(*pos))
        batch = next(self._host[1])
        s = self.sampler
        nxt = (s.epoch, s.step + 1) if s.step + 1 < s.steps_per_epoch else (s.epoch + 1, 0)
        self._host = (nxt, self._host[1])
        return batch

    def _stream(self, epoch: int, step: int, *, pin: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        # a module-level generator: one whose frame held `self` would make a reference cycle
        # (loader -> _host -> generator -> loader), and a DataLoader iterator freed by the
        # cycle collector finds its queues already finalised and waits 5 s per worker to join
        return host_batches(self.dataset, self.sampler, self.cfg, epoch, step, pin=pin,
                            on_batch=self.downloads.at if self.downloads is not None else None)

    def _delivered(self, batch: dict[str, torch.Tensor]) -> None:
        self._took(int(batch["epoch"]), int(batch["step"]), int(batch["num_skipped"]))

    def _took(self, epoch: int, step: int, num_skipped: int) -> None:
        """The batch at (epoch, step) reached the caller: the state moves past it."""
        self.num_skipped += num_skipped
        self.sampler.epoch, self.sampler.step = epoch, step
        self.sampler.advance()

    def state_dict(self) -> dict[str, int]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.sampler.load_state_dict(state)

    def close(self) -> None:
        """Stop the worker processes, close this process's shard files and stop the cache's
        downloads now rather than at garbage collection (a later batch reopens what it needs)."""
        self._host = None
        self.dataset.close()


WORKER_SIGTERM_GRACE_S = 120  # > the 30 s Slurm (KillWait) and torchrun give a job before SIGKILL


def _outlive_stop_signals(_worker_id: int) -> None:
    """In a worker (after torch's own handlers): a SIGTERM arms an alarm instead of killing it, so
    it keeps serving its trainer's last step; the alarm ends it later if nothing else has. A SIGINT
    (Ctrl-C reaches the whole foreground group) is ignored: torch's worker would end its loop."""
    signal.signal(signal.SIGTERM, lambda *_: signal.alarm(WORKER_SIGTERM_GRACE_S))
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def host_batches(ds: ShardDataset | MixtureDataset | FeatureDataset, s: StepSampler, cfg: LoaderConfig, epoch: int, step: int, *,
                 pin: bool = False,
                 on_batch: Callable[[int, int], None] | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Host batches from (epoch, step) on, images lent (`cfg.lend_batches`, see `loans`): with
    workers, each worker's shared-memory buffer itself (`shm_pool`), without, a reused buffer of
    this process; a buffer is refilled only once no tensor refers to it. `pin`: those buffers are
    page-locked for CUDA (the workers' ring registered with `cudaHostRegister` when
    `cfg.register_ring`), so the device batcher copies straight from them. `on_batch(epoch, step)`
    is called as each batch's positions are handed to the DataLoader (remote roots: `EpochDownloads.at`)."""
    pool, ring, dataset = None, None, ds
    if cfg.num_workers:
        pool = BufferPool(*pool_shape(cfg, ds))
        dataset = PooledDataset(ds, pool)
    elif cfg.lend_batches:
        ring = HostRing(cfg.worker_buffers or cfg.prefetch_factor + 2, buffer_bytes_for(ds, cfg.batch_size), pin=pin)
        dataset = _RingReads(ds, ring)
    loader = torch.utils.data.DataLoader(
        dataset, batch_sampler=_StepBatches(s, epoch, step, on_batch), collate_fn=identity_collate,
        num_workers=cfg.num_workers, prefetch_factor=cfg.prefetch_factor if cfg.num_workers else None,
        worker_init_fn=_outlive_stop_signals if cfg.num_workers else None,
    )
    loans, unpin = Loans(), None
    it = iter(loader)  # forks the workers: the ring is page-locked after, so no child inherits a pinned mapping
    try:
        if pool is not None and pin and cfg.register_ring:
            unpin = pin_host(pool.buf, "LoaderConfig.register_ring")
        while True:
            for w, b in loans.returned():  # buffers the caller has dropped go back to their workers
                pool.release(w, b)  # before waiting on the workers (one of them may need one)
            item = next(it, None)
            if item is None:
                return
            if isinstance(item, WorkerFailure):
                raise item.error  # the worker's own one-line error (a ShardError naming the shard)
            if pool is not None:
                # never lend a worker's last free buffer: a caller keeping every batch gets copies
                lent = sum(1 for w, _ in loans.outstanding() if w == item.worker)
                lend = cfg.lend_batches and lent + 1 < pool.buffers
                batch = pool.receive(item, loans if lend else None)
            else:
                batch = item
            if isinstance(ds, FeatureDataset):  # raw tensors typed in place (no copy)
                batch = ds.host_view(batch)
            batch["epoch"] = torch.tensor(epoch)
            batch["step"] = torch.tensor(step)
            yield batch
            del batch  # the caller's reference alone keeps the buffer out
            epoch, step = (epoch, step + 1) if step + 1 < s.steps_per_epoch else (epoch + 1, 0)
    finally:
        if pool is not None:
            pool.close()  # before the DataLoader iterator goes: its workers may wait on buffers
        if unpin is not None:
            unpin()


class _RingReads(torch.utils.data.Dataset):
    """The single-process DataLoader's dataset: batches read into the lent `HostRing`."""

    def __init__(self, dataset: ShardDataset | MixtureDataset | FeatureDataset, ring: HostRing):
        self.dataset, self.ring = dataset, ring

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        raise TypeError("_RingReads only serves whole batches (`__getitems__`)")

    def __getitems__(self, positions: list[int]) -> dict[str, torch.Tensor]:
        return self.dataset.read_batch(positions, alloc=self.ring.alloc)
