"""Per-item losses of each family (`model(batch, per_item=True)`), which the per-source loss of a
mixture is built from. Oracle: the same model on each sample alone (every family's loss treats
samples independently), and the scalar loss of `model(batch)` itself, which must not change (the
recorded pi05 losses hold it bit for bit: tests/trainkit/models/test_trainkit_family.py)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from test_dreamzero import tiny_batch as dreamzero_batch
from test_gr00t import tiny_batch as gr00t_batch
from test_trainkit_model import make_batch as pi05_batch
from trainkit.models import build_model


def _gr00t(cfg):
    batch = gr00t_batch(cfg, b=3)
    batch.action_mask[1, :, 4:] = False  # samples of different robots: 7, 4 and 7 real action channels
    return batch


BATCHES = {"pi05": lambda cfg: pi05_batch(cfg, b=3, text_valid=30), "gr00t": _gr00t,
           "dreamzero": lambda cfg: dreamzero_batch(cfg, b=3)}


def _sample(batch, i: int):
    return dataclasses.replace(batch, **{f.name: v[i:i + 1] for f in dataclasses.fields(batch)
                                         if isinstance(v := getattr(batch, f.name), torch.Tensor)})


@pytest.mark.parametrize("name", sorted(BATCHES))
def test_per_item_losses_are_each_samples_own_loss_and_leave_the_loss_unchanged(name):
    torch.manual_seed(0)
    model = build_model(name, "tiny")
    batch = BATCHES[name](model.cfg)
    with torch.no_grad():
        loss = model(batch)
        same, items = model(batch, per_item=True)
        alone = torch.stack([model(_sample(batch, i)) for i in range(3)])
    assert torch.equal(same, loss)  # bit for bit
    assert items.shape == (3,) and items.dtype == torch.float32 and not items.requires_grad
    torch.testing.assert_close(items, alone, rtol=1e-4, atol=1e-6)
    assert len(set(items.tolist())) == 3  # three different samples, three different losses
    if name != "gr00t":  # equal-sized samples: the batch loss is their mean (GR00T's is over the whole mask)
        torch.testing.assert_close(items.mean(), loss, rtol=1e-5, atol=0)


def test_pi05_real_action_channels_of_a_mixture_are_each_items_own():
    """loss_over = "real" with a mixture's action mask: each item averages over its own robot's channels
    (a 7-channel robot's item alone is LeRobot's reduction over [..., :7]); the batch loss over all real ones."""
    torch.manual_seed(0)
    model = build_model("pi05", "tiny", {"loss_over": "real"})
    batch = pi05_batch(model.cfg, b=2, text_valid=30)
    dims = (7, 4)
    mask = torch.arange(model.cfg.action_dim)[None] < torch.tensor(dims)[:, None]
    with torch.no_grad():
        loss, items = model(dataclasses.replace(batch, action_mask=mask), per_item=True)
        alone = [model(dataclasses.replace(_sample(batch, i), action_dims=d)) for i, d in enumerate(dims)]
    torch.testing.assert_close(items, torch.stack(alone), rtol=1e-5, atol=0)
    torch.testing.assert_close(loss, (items * torch.tensor(dims)).sum() / sum(dims), rtol=1e-5, atol=0)
