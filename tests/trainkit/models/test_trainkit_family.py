"""The model-family contract (trainkit/models/family.py), held to two oracles:

- Pi0.5 moved onto the contract unchanged: its losses over a fixed tiny run (same seed, same
  shards, one process, one thread) equal, bit for bit, the ones `tests/fixtures/pi05_losses_record.py`
  recorded from main before the move (tests/assets/pi05_tiny_losses.json): bit for bit under the
  record's torch on a CPU with a record of its own (its `cpu_kernels` key, tests/fixtures/cpu_kernels.py:
  the capability and the matrix instruction sets MKL and oneDNN choose kernels by), within `OTHER_CPU_ABS`
  elsewhere, as other BLAS kernels sum in other orders (tests/fixtures/pi05_losses_record.py --this-cpu).
- A fourth family, defined in this file alone, trains through `trainkit run`: registered at run
  time, its `model.*` overrides reach its config, its frozen block list keeps its initial weights,
  and the FLOPs and tokens the trainer counts are the record's (metrics.jsonl, against the
  record's functions evaluated here by hand).
"""
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.errors import ModelConfigError
from trainkit_harness import TINY, tiny_config

RECORDED = Path(__file__).resolve().parents[2] / "assets" / "pi05_tiny_losses.json"


@pytest.mark.parametrize("name", ["uint8_pruned", "float32_padded"])
def test_pi05_losses_equal_the_ones_recorded_before_the_contract(shards_rgb, tmp_path, name):  # noqa: F811
    from trainkit.train import run

    from cpu_kernels import OTHER_CPU_ABS, cpu_kernels

    doc = json.loads(RECORDED.read_text())
    own = doc.get("runs_by_cpu_kernels", {}).get(cpu_kernels())  # this CPU's record: bit for bit
    # else the record of this capability (an older key), or the first record, within OTHER_CPU_ABS
    runs = (own or doc.get("runs_by_cpu_capability", {}).get(torch.backends.cpu.get_cpu_capability(), doc))["runs"]
    recorded = {int(k): v for k, v in runs[name]["losses"].items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(doc["threads"])
    try:
        losses = run(tiny_config(shards_rgb, tmp_path / name, *doc["runs"][name]["overrides"])).losses
    finally:
        torch.set_num_threads(threads)
    if own is not None and torch.__version__ == doc["torch"]:
        assert losses == recorded
    else:
        assert losses == pytest.approx(recorded, abs=OTHER_CPU_ABS)


# --- a fourth family, in this file only --------------------------------------------------------------
TOY_HORIZON, TOY_SIDE = 4, 8  # actions per sample, image side after the device resize
BUILT: list[nn.Module] = []  # every Toy built, so the test can look at the trained one


@dataclass(kw_only=True)
class ToyConfig:
    width: int  # channels of the blocks
    depth: int = 2  # trained residual MLP blocks
    action_dim: int = 6  # action channels (the fixture's 6, no padding)
    max_slots: int = 3

    def __post_init__(self) -> None:
        if self.width < 1 or self.depth < 1:
            raise ModelConfigError(f"ToyConfig: width {self.width} and depth {self.depth} must be >= 1")


@dataclass
class ToyBatch:
    images: torch.Tensor  # (B, S, 3, side, side)
    actions: torch.Tensor  # (B, horizon, A)
    noise: torch.Tensor  # (B, horizon, A): a host extra


class Toy(nn.Module):
    """A frozen per-slot image encoder, then trained residual MLPs predicting noise - actions."""

    BLOCK_LISTS = ("encoder", "blocks")

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = nn.ModuleList([nn.Linear(3 * TOY_SIDE * TOY_SIDE, cfg.width)])
        self.blocks = nn.ModuleList(nn.Linear(cfg.width, cfg.width) for _ in range(cfg.depth))
        self.head = nn.Linear(cfg.width + TOY_HORIZON * cfg.action_dim, TOY_HORIZON * cfg.action_dim)
        BUILT.append(self)

    @torch.no_grad()
    def init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.1)
                nn.init.zeros_(m.bias)

    def forward(self, batch: ToyBatch) -> torch.Tensor:
        x = self.encoder[0](batch.images.flatten(2).float()).mean(dim=1)
        for block in self.blocks:
            x = x + torch.tanh(block(x))
        x_t = (0.5 * batch.noise + 0.5 * batch.actions).flatten(1)
        pred = self.head(torch.cat([x, x_t], dim=1)).view_as(batch.actions)
        return F.mse_loss(pred, batch.noise - batch.actions)


def toy_tokens(cfg: ToyConfig, n_slots: int) -> dict[str, int]:
    return {"images": n_slots, "sequence": n_slots + TOY_HORIZON}


def toy_flops(cfg: ToyConfig, n_slots: int) -> float:
    """Frozen encoder 1x its forward, trained blocks and head 3x."""
    encoder = 2 * n_slots * 3 * TOY_SIDE * TOY_SIDE * cfg.width
    trained = 2 * cfg.depth * cfg.width ** 2 + 2 * (cfg.width + TOY_HORIZON * cfg.action_dim) * TOY_HORIZON * cfg.action_dim
    return encoder + 3.0 * trained


def toy_activations(cfg: ToyConfig, n_slots: int):
    from trainkit.models import Activations
    return Activations(blocks={"encoder": [(n_slots * cfg.width, n_slots * 3 * TOY_SIDE ** 2)],
                               "blocks": [(2 * cfg.width, cfg.width)] * cfg.depth})


def toy_loader_config(cfg: ToyConfig, index, **kw):
    from datakit.loader import LoaderConfig
    return LoaderConfig(frame_offsets=(0,), action_horizon=TOY_HORIZON, resize=(TOY_SIDE, TOY_SIDE), **kw)


class ToyBatches:
    def __init__(self, cfg: ToyConfig, index, normaliser):
        self.cfg = cfg

    def extras(self, hb, generator):
        b = hb["action"].shape[0]
        return {**hb, "noise": torch.randn((b, TOY_HORIZON, self.cfg.action_dim), generator=generator)}

    def model_batch(self, b) -> ToyBatch:
        return ToyBatch(images=b["images"][:, :, -1], actions=b["action"].float(), noise=b["noise"])


@pytest.fixture
def toy_family():
    from trainkit.models import FAMILIES, Family, register

    fam = register(Family(name="toy", config=ToyConfig, presets={"tiny": lambda: ToyConfig(width=16)}, model=Toy,
                          frozen=("encoder",), flops_per_sample=toy_flops, tokens_per_sample=toy_tokens,
                          activations=toy_activations, max_slots=lambda cfg: cfg.max_slots,
                          loader_config=toy_loader_config, batches=ToyBatches))
    BUILT.clear()
    yield fam
    del FAMILIES["toy"]


def test_a_family_defined_in_a_test_trains_through_trainkit_run(toy_family, shards_rgb, tmp_path, capsys):  # noqa: F811
    from trainkit.cli import main

    out = tmp_path / "toy"
    overrides = [f"data.shards={shards_rgb}", f"output.dir={out}", "output.progress=false", "data.num_workers=0",
                 "model.family=toy", "model.preset=tiny", "model.width=24", "train.steps=30", "train.seed=1",
                 "parallel.fsdp=none", "parallel.ac_stride={}", "parallel.group={}", "optim.lr=1e-2",
                 "optim.warmup_steps=0", "output.log_every=30"]
    code = main(["run", str(TINY), *[a for o in overrides for a in ("--set", o)]])
    assert code == 0, capsys.readouterr().err
    (model,) = BUILT  # built on the meta device, then materialised and trained
    assert model.cfg == ToyConfig(width=24) and len(model.blocks) == 2  # model.width reached the config

    with torch.device("meta"):  # as the trainer: built on meta, initialised from train.seed after to_empty
        reference = Toy(ToyConfig(width=24)).to_empty(device="cpu")
    torch.manual_seed(1)
    reference.init_weights()
    assert torch.equal(model.encoder[0].weight, reference.encoder[0].weight)  # frozen: untouched
    assert not any(p.requires_grad for p in model.encoder.parameters())
    assert not torch.equal(model.blocks[0].weight, reference.blocks[0].weight)  # trained

    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x["loss"] for x in lines if x["kind"] == "step"]
    assert len(steps) == 30 and all(math.isfinite(x) for x in steps)
    assert sum(steps[-5:]) < sum(steps[:5])
    interval = next(x for x in lines if x["kind"] == "interval")
    slots = interval["image_slots"]
    assert slots == 2  # the fixture's blank third camera is pruned
    per_sample = interval["model_flops_per_s_gpu"] / interval["samples_per_s_gpu"]
    assert per_sample == pytest.approx(toy_flops(ToyConfig(width=24), slots), rel=1e-9)
    tokens = interval["tokens_per_s_gpu"] / interval["samples_per_s_gpu"]
    assert tokens == pytest.approx(slots + TOY_HORIZON, rel=1e-9)
    assert json.loads((out / "summary.json").read_text())["family"] == "toy"


def test_inspect_reaches_the_family_through_its_record(toy_family):
    from trainkit.config import load_config
    from trainkit.estimate.inspect import inspect_model
    from trainkit.estimate.memory import saved_elements

    cfg = load_config(TINY, ["model.family=toy", "model.preset=tiny", "model.depth=3", "parallel.group={}",
                             "parallel.ac_stride={blocks = 1}"], required=False)
    report = inspect_model(cfg, world_size=1)
    width, encoder = 16, 3 * TOY_SIDE ** 2 * 16 + 16
    assert report["params"]["by_part"] == {"encoder": encoder, "blocks": 3 * (width * width + width),
                                           "root": (width + TOY_HORIZON * 6) * TOY_HORIZON * 6 + TOY_HORIZON * 6}
    assert report["params"]["trainable"] == report["params"]["total"] - encoder
    assert report["flops_per_sample"]["2"] == toy_flops(ToyConfig(width=16, depth=3), 2)
    assert report["tokens_per_sample"]["3"] == {"images": 3, "sequence": 3 + TOY_HORIZON}
    assert report["recompute"] == {"encoder": [], "blocks": [0, 1, 2]}
    # one sample, 3 slots: the encoder (not recomputed) keeps 3 x 16, each recomputed block its
    # 16-wide input. Fullest in backward: the last block, recomputed (2 x 16), its gradient
    # temporaries (2 x 16), and what the blocks before it keep (48 + 2 x 16)
    table = toy_activations(ToyConfig(width=16, depth=3), report["slots_max"])
    assert saved_elements(table, report["recompute"]) == (3 * 16 + 3 * 16, 48 + 2 * 16 + 2 * 2 * 16)


def test_model_overrides_are_checked_by_the_family_config(toy_family, shards_rgb, tmp_path, capsys):  # noqa: F811
    from trainkit.cli import main

    base = [f"data.shards={shards_rgb}", f"output.dir={tmp_path}", "model.family=toy", "model.preset=tiny"]
    for bad, said in (("model.widht=3", "trainkit: model.widht: not a field of ToyConfig"),
                      ("model.depth=0", "trainkit: ToyConfig: width 16 and depth 0 must be >= 1")):
        code = main(["run", str(TINY), *[a for o in (*base, bad) for a in ("--set", o)]])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith(said), err
