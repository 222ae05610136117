"""The loader's `tile="wrist_top"` option, against the generator's own frames: each canvas holds
the wrist view widened (every column twice) across the top row and the two exterior views below,
pixel for pixel, for every frame of the clip (the window clamped at the episode start as the
loader pads it). Bad combinations are refused at construction."""
import numpy as np
import pytest
import torch

from datakit.loader import LoaderConfig, ShardLoader
from dreamzero_fixtures import CAMS3, VIEW_HW, shards_3cam, source_frame  # noqa: F401 - session fixture

OFFSETS = tuple(range(-4, 1))
# DreamZero-shaped samples, as trainkit's dreamzero loader preset sets them (a 33-frame clip, 32
# actions; tiling keeps every slot)
DREAMZERO_SHAPE = {"frame_offsets": tuple(range(-32, 1)), "action_horizon": 32, "prune_slots": False}


def expected_canvas(episode: int, frame: int) -> np.ndarray:
    wrist, ext1, ext2 = (source_frame(episode, frame, c) for c in range(3))
    return np.concatenate([np.repeat(wrist, 2, axis=1), np.concatenate([ext1, ext2], axis=1)], axis=0)


@pytest.mark.parametrize("h2d", ["device", "host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_tiled_canvas_holds_each_view_where_the_tiling_says(shards_3cam, h2d):  # noqa: F811
    if h2d == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cfg = LoaderConfig(**{**DREAMZERO_SHAPE, "slots": CAMS3, "tile": "wrist_top", "frame_offsets": OFFSETS,
                          "action_horizon": 4, "batch_size": 4, "shuffle": "random", "image_mean": (0.0, 0.0, 0.0),
                          "image_std": (1.0, 1.0, 1.0), "image_dtype": "float32", "pin_memory": h2d == "cuda"})
    loader = ShardLoader(shards_3cam, cfg)
    if h2d in ("device", "cuda"):  # the trainer's path: uint8 batch -> normaliser on the device (or the CPU)
        batches = [{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
                   for b in loader.device_batches("cuda" if h2d == "cuda" else "cpu", steps=3)]
    else:  # the baseline path: the same normaliser run on host batches
        from datakit.loader import Normaliser
        norm = Normaliser.from_index(loader.dataset.index, cfg)
        batches = [norm(hb) for hb, _ in zip(loader, range(3))]
    h, w = VIEW_HW
    checked = 0
    for b in batches:
        assert b["images"].shape == (4, 1, len(OFFSETS), 3, 2 * h, 2 * w)
        assert b["image_mask"].shape == (4, 3) and bool(b["image_mask"].all())
        pixels = (b["images"][:, 0] * 255).round().to(torch.uint8).permute(0, 1, 3, 4, 2).numpy()
        for i, (ep, t) in enumerate(zip(b["episode_index"].tolist(), b["frame_index"].tolist())):
            for j, off in enumerate(OFFSETS):
                np.testing.assert_array_equal(pixels[i, j], expected_canvas(ep, max(0, t + off)))
                checked += 1
    assert checked == 3 * 4 * len(OFFSETS)


def test_wrist_top_canvas_of_176x320_views_is_352x640():
    from datakit.loader.tiling import tile_views, tiled_shape

    views = torch.arange(3 * 176 * 320, dtype=torch.int32).view(1, 3, 1, 1, 176, 320)
    canvas = tile_views(views, "wrist_top")
    assert tiled_shape("wrist_top", 176, 320) == (352, 640) and canvas.shape == (1, 1, 1, 1, 352, 640)
    c = canvas[0, 0, 0, 0]
    assert torch.equal(c[:176, 0::2], views[0, 0, 0, 0]) and torch.equal(c[:176, 1::2], views[0, 0, 0, 0])
    assert torch.equal(c[176:, :320], views[0, 1, 0, 0]) and torch.equal(c[176:, 320:], views[0, 2, 0, 0])


@pytest.mark.parametrize("kw, said", [
    ({"slots": CAMS3[:2]}, "needs slots naming its 3 views"),
    ({"slots": CAMS3, "prune_slots": True}, "prune_slots=False"),
    ({"slots": CAMS3, "crop": (4, 4)}, "no crop"),
    ({"slots": CAMS3, "tile": "grid"}, "tile='grid' is not one of wrist_top"),
])
def test_tiling_refuses_canvases_it_cannot_build(kw, said):
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        LoaderConfig(**{**DREAMZERO_SHAPE, "tile": "wrist_top", **kw})
