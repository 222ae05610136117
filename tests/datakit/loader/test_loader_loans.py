"""Lent host batches (`datakit.loader.loans`, `LoaderConfig.lend_batches`): the bytes are right,
a batch stays intact for as long as any part of it is held, and `lend_batches=False` copies; on a
GPU, the device path copies straight from the registered ring (`register_ring`) and is exact.

Oracles: the shard files read with numpy at the byte offsets of the index's frames table (no
loader code), and the workers' ring itself (its address range) for whether a batch was lent.
GPU tests carry `@pytest.mark.gpu` and skip when CUDA is absent.
"""
import numpy as np
import pytest
import torch

from datakit.loader import LoaderConfig, ShardLoader
from datakit.loader import gpu_batch
from datakit.loader import loader as loader_mod
from datakit.loader.gpu_batch import PinnedRing, pin_host
from datakit.loader.loans import HostRing, Loans
from datakit.loader.shm_pool import BufferPool
from datakit.shards.index import OFFSET_PREFIX, load_frames, load_index
from loader_fixtures import CAMS, shards_rgb  # noqa: F401


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class ShardBytes:
    """Frame bytes straight from the shard files at the frames table's offsets."""

    def __init__(self, root):
        self.root, self.index = root, load_index(root)
        frames = load_frames(root)
        self.shard = frames.column("shard").to_numpy()
        self.offset = {c: frames.column(OFFSET_PREFIX + c).to_numpy() for c in CAMS}
        self.shape = tuple(self.index.cameras[CAMS[0]].frame_shape)

    def frame(self, row: int, cam: str) -> np.ndarray:
        path = self.root / self.index.shards[int(self.shard[row])].name
        n = int(np.prod(self.shape))
        return np.fromfile(path, np.uint8, count=n, offset=int(self.offset[cam][row])).reshape(self.shape)

    def check(self, batch, slot_names=CAMS):
        """Every image of `batch` (current frame only) equals the bytes in its shard."""
        for i, row in enumerate(batch["row"].tolist()):
            for j, s in enumerate(batch["slot_index"].tolist()):
                assert np.array_equal(batch["images"][i, j, 0].numpy(), self.frame(row, slot_names[s])), (row, s)


def _ring_spy(monkeypatch):
    """The BufferPools the loader makes, so a test can ask whether an image lies in one."""
    pools = []

    class Spy(BufferPool):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            pools.append(self)
    monkeypatch.setattr(loader_mod, "BufferPool", Spy)

    def in_ring(t: torch.Tensor) -> bool:
        return any(p.buf.data_ptr() <= t.data_ptr() < p.buf.data_ptr() + p.buf.numel() for p in pools)
    return in_ring


# --- the ledger on its own ------------------------------------------------------------------
def test_a_loan_is_returned_only_when_no_tensor_or_array_of_it_is_left():
    loans, buf = Loans(), np.arange(24, dtype=np.uint8)
    t = loans.lend("a", buf[:12]).view(3, 4)
    part = t[1]
    arr = t[2].numpy()
    del t
    assert loans.returned() == [] and loans.outstanding() == ["a"]
    del part
    assert loans.returned() == []  # the numpy array of a slice still holds the memory
    assert arr.tolist() == [8, 9, 10, 11]
    del arr
    assert loans.returned() == ["a"] and loans.outstanding() == []
    with pytest.raises(RuntimeError, match="lent twice"):
        loans.lend("b", buf), loans.lend("b", buf)


def test_host_ring_reuses_a_dropped_buffer_and_allocates_when_all_are_held():
    ring = HostRing(2, 64)
    a = ring.alloc((4, 8))
    b = ring.alloc((2, 8))
    c = ring.alloc((4, 8))  # both ring buffers held: new memory
    assert len({a.data_ptr(), b.data_ptr(), c.data_ptr()}) == 3
    pa = a.data_ptr()
    del a
    assert ring.alloc((8, 8)).data_ptr() == pa


# --- through the loader ---------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_kept_lent_batches_equal_the_shard_bytes(shards_rgb, workers):
    """Three epochs kept in a list: the ring is out on loan after a few batches, the rest are
    copies, and no kept batch was refilled."""
    cfg = LoaderConfig(batch_size=8, seed=2, num_workers=workers)
    loader = ShardLoader(shards_rgb, cfg)
    kept = [b for _ in range(3) for b in loader]
    oracle = ShardBytes(shards_rgb)
    for b in kept:
        oracle.check(b)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_held_slice_keeps_its_buffer_out_of_the_ring_until_dropped(shards_rgb, workers, monkeypatch):
    in_ring = _ring_spy(monkeypatch)
    oracle = ShardBytes(shards_rgb)
    loader = ShardLoader(shards_rgb, LoaderConfig(batch_size=8, seed=5, num_workers=workers, worker_buffers=4))
    stream = loader._stream(0, 0)
    first = next(stream)
    assert in_ring(first["images"])  # lent, not copied
    row, slot = int(first["row"][3]), int(first["slot_index"][1])
    held = first["images"][3, 1, 0]  # one image of the batch; the rest of it is dropped
    ptr = first["images"].data_ptr()
    del first
    later = []
    for _ in range(30):  # the ring's other buffers are lent and refilled many times over
        b = next(stream)
        later.append(b["images"].data_ptr())
    assert ptr not in later
    assert len(set(later)) < len(later)  # the others were reused
    assert np.array_equal(held.numpy(), oracle.frame(row, CAMS[slot]))
    del held
    assert ptr in [next(stream)["images"].data_ptr() for _ in range(2 * workers * 4)]  # back in the ring


def test_the_plain_loop_copies_nothing_and_lend_batches_false_copies_every_batch(shards_rgb, monkeypatch):
    in_ring = _ring_spy(monkeypatch)
    oracle = ShardBytes(shards_rgb)
    for lend in (True, False):
        loader = ShardLoader(shards_rgb, LoaderConfig(batch_size=8, seed=1, num_workers=2, lend_batches=lend))
        flags = []
        for b in loader:
            flags.append(in_ring(b["images"]))
            oracle.check(b)
        assert flags == [lend] * len(flags), lend


# --- the device path ------------------------------------------------------------------------
@pytest.mark.gpu
@cuda
def test_pin_host_page_locks_shared_memory_and_unpin_lets_go():
    pool = BufferPool(num_workers=1, buffers=2, buffer_bytes=1 << 20)
    assert not pool.buf.is_pinned()
    unpin = pin_host(pool.buf, "LoaderConfig.register_ring")
    assert pool.buf.is_pinned() and pool.view(0, 1, (64, 8)).is_pinned()
    unpin()
    assert not pool.buf.is_pinned()


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("workers,register,in_place", [(2, True, True), (2, False, False), (0, True, True)])
def test_device_batches_equal_the_shard_bytes_and_images_skip_staging_when_pinned(shards_rgb, monkeypatch,
                                                                               workers, register, in_place):
    """Three epochs through the device path (the ring cycles many times). Normalised with mean 0,
    std 1 in float32, x * 255 gives back the exact bytes."""
    passed = []

    class Spy(PinnedRing):
        def stage(self, batch):
            out, n = super().stage(batch)
            passed.append(out["images"] is batch["images"])  # used in place, not copied into staging
            return out, n
    monkeypatch.setattr(gpu_batch, "PinnedRing", Spy)
    cfg = LoaderConfig(batch_size=8, seed=3, num_workers=workers, register_ring=register, image_dtype="float32",
                       image_mean=(0.0, 0.0, 0.0), image_std=(1.0, 1.0, 1.0))
    loader = ShardLoader(shards_rgb, cfg)
    steps = 3 * loader.sampler.steps_per_epoch
    oracle = ShardBytes(shards_rgb)
    n = 0
    for b in loader.device_batches("cuda", steps=steps):
        assert b["images"].is_cuda
        u8 = (b["images"] * 255).round().to(torch.uint8).permute(0, 1, 2, 4, 5, 3).cpu()  # (B,K,T,H,W,3)
        oracle.check({"images": u8, "row": b["row"].cpu(), "slot_index": b["slot_index"].cpu()})
        n += 1
    assert n == steps and loader.state_dict()["epoch"] == 3
    assert passed and set(passed) == {in_place}
