"""LoRA through `trainkit run` and `trainkit export`, every family's tiny preset (trainkit/models/lora.py):

- only the adapters train (pi05: LeRobot's targets, nothing else; DreamZero: the adapters and the
  action/state MLPs, as DreamZero's recipe), and the frozen base is bit-identical between two
  checkpoints three steps apart while the adapters moved;
- a run resumed from a LoRA checkpoint gives the unbroken run's losses bit for bit;
- world size 2 (gloo, FSDP2, frozen base replicated) trains as world size 1;
- the merged export (a family format) holds base + (alpha / r) B @ A where adapted and the base
  elsewhere, and a LoRA-free model loading it (`model.init_from`) computes the LoRA model's loss;
- `--format peft` writes adapter_config.json + adapter_model.safetensors in peft's key layout under
  the family's checkpoint names (pi05: LeRobot's, checked against the lerobot export's keys), and
  peft itself loads them onto the base and computes the LoRA model's output (skipped without peft);
- a run without adapters is refused by `--format peft` in one line.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from dreamzero_fixtures import shards_3cam  # noqa: F401 - session fixture
from loader_fixtures import shards_rgb  # noqa: F401 - session fixture
from trainkit.errors import CheckpointError
from trainkit.models import build_model
from trainkit.models.lora import LoRALinear, lora_layers
from trainkit.weights.export import export_run, load_run_model
from trainkit_harness import ROOT, run_distributed, tiny_config

CONFIGS = ROOT / "trainkit" / "configs"
PI05 = ("model.lora_rank=2", "train.micro_batch=2", "optim.schedule=constant", "output.log_every=1",
        "output.checkpoint_every=1", "output.keep_checkpoints=0", "parallel.ac_stride={}")
DZ = ("model.lora_rank=2", "train.micro_batch=2", "optim.schedule=constant", "output.log_every=1",
      "output.checkpoint_every=1", "output.keep_checkpoints=0", "parallel.ac_stride={}")


def test_only_the_adapters_are_trainable():
    pi05 = build_model("pi05", "tiny", {"lora_rank": 2})
    trained = {n for n, p in pi05.named_parameters() if p.requires_grad}
    assert trained == {f"{path}.lora_{ab}.weight" for path in lora_layers(pi05) for ab in "AB"}
    assert set(lora_layers(pi05)) == {"action_in", "action_out"} | {f"lm_layers.{i}.expert.qkv" for i in range(2)}
    qkv = pi05.lm_layers[0].expert.qkv
    assert [p[0] for p in qkv.parts] == ["q_proj", "v_proj"]  # k_proj's rows keep the base alone
    assert all(p.requires_grad for p in build_model("pi05", "tiny").parameters())  # LoRA off: all train


@pytest.mark.timeout(300)
def test_pi05_lora_trains_resumes_and_exports(shards_rgb, tmp_path):  # noqa: F811
    first, resumed, unbroken = tmp_path / "first", tmp_path / "resumed", tmp_path / "unbroken"
    [a] = run_distributed([tiny_config(shards_rgb, first, *PI05, "train.steps=1")], world=1)
    assert "error" not in a, a.get("error")
    shutil.copytree(first, resumed)
    cfgs = [tiny_config(shards_rgb, resumed, *PI05, "train.steps=4", "output.resume=true"),
            tiny_config(shards_rgb, unbroken, *PI05, "train.steps=4")]
    b, c = run_distributed(cfgs, world=1)
    assert "error" not in b and "error" not in c, (b.get("error"), c.get("error"))
    assert b["start_step"] == 1 and {s: b["losses"][s] for s in (1, 2, 3)} == {s: c["losses"][s] for s in (1, 2, 3)}

    at1, _, _ = load_run_model(first)
    at4, _, _ = load_run_model(resumed)
    s1, s4 = at1.state_dict(), at4.state_dict()
    moved = {k for k in s1 if not torch.equal(s1[k], s4[k])}
    assert moved and all(".lora_" in k for k in moved), sorted(moved)[:5]  # the base bit-identical
    assert {k for k in s1 if ".lora_B." in k} <= moved  # every B left zero and moved

    merged = tmp_path / "merged"
    export_run(resumed, merged, "lerobot")
    tensors = load_file(merged / "model.safetensors")
    qkv = at4.lm_layers[1].expert.qkv
    cfg = at4.cfg
    q, kv = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim
    e = "model.paligemma_with_expert.gemma_expert.model.layers.1.self_attn."
    base, a_w, b_w = qkv.base_layer.weight, qkv.lora_A.weight, qkv.lora_B.weight
    want_q = base[:q] + (cfg.lora_alpha / cfg.lora_rank) * b_w[:q] @ a_w[:2]
    torch.testing.assert_close(tensors[e + "q_proj.weight"], want_q, rtol=0, atol=1e-7)
    assert torch.equal(tensors[e + "k_proj.weight"], base[q:q + kv])  # k_proj not adapted: the base
    want_v = base[q + kv:] + (cfg.lora_alpha / cfg.lora_rank) * b_w[q:] @ a_w[2:]
    torch.testing.assert_close(tensors[e + "v_proj.weight"], want_v, rtol=0, atol=1e-7)
    assert not torch.equal(tensors[e + "q_proj.weight"], base[:q])  # the adapter is in it

    # the merged weights in a LoRA-free model compute the LoRA model's loss
    from test_trainkit_model import make_batch
    from trainkit.models import family
    from trainkit.weights.load import load_weights

    plain = build_model("pi05", "tiny")
    load_weights(plain, family("pi05"), merged, lambda s: None)
    batch = make_batch(cfg, b=2, slots=3)
    with torch.no_grad():
        torch.testing.assert_close(plain(batch), at4(batch), rtol=1e-5, atol=1e-6)

    adapters = tmp_path / "adapters"
    export_run(resumed, adapters, "peft")
    config = json.loads((adapters / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 2, cfg.lora_alpha)
    peft = load_file(adapters / "adapter_model.safetensors")
    assert set(peft) == {f"base_model.model.{m}.lora_{ab}.weight" for m in config["target_modules"] for ab in "AB"}
    assert {m + ".weight" for m in config["target_modules"]} <= set(tensors)  # LeRobot's module names
    assert torch.equal(peft[f"base_model.model.{e}v_proj.lora_B.weight"], b_w[q:])
    assert config["modules_to_save"] is None  # LeRobot's modules_to_save = []


@pytest.mark.timeout(300)
def test_dreamzero_lora_world_size_two_trains_as_one(shards_3cam, tmp_path):  # noqa: F811
    """Both resume one 2-rank checkpoint (DCP reshards it), the frozen base replicated as the LoRA
    presets run; float32, measured max |diff| 0.0 over 3 steps (torch 2.13 CPU)."""
    common = (*DZ, "train.global_batch=4", "parallel.fsdp=block", "parallel.frozen=replicate", "output.resume=true",
              "data.h2d_dtype=uint8")
    dz = CONFIGS / "dreamzero_tiny.toml"
    start = tmp_path / "start"
    [first] = run_distributed([tiny_config(shards_3cam, start, *common, "train.steps=1", config=dz)], world=2)
    assert "error" not in first, first["error"]
    for name in ("world1", "world2"):
        shutil.copytree(start, tmp_path / name)
    [one] = run_distributed([tiny_config(shards_3cam, tmp_path / "world1", *common, "train.steps=4", config=dz)], world=1)
    [two] = run_distributed([tiny_config(shards_3cam, tmp_path / "world2", *common, "train.steps=4", config=dz)], world=2)
    assert "error" not in one and "error" not in two, (one.get("error"), two.get("error"))
    assert one["start_step"] == two["start_step"] == 1
    assert max(abs(one["losses"][s] - two["losses"][s]) for s in (1, 2, 3)) <= 1e-5
    assert "frozen_replicated" in two["applied"]


@pytest.mark.timeout(300)
def test_dreamzero_lora_exports_merged_and_peft(shards_3cam, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    [r] = run_distributed([tiny_config(shards_3cam, run, *DZ, "train.steps=2", config=CONFIGS / "dreamzero_tiny.toml")],
                          world=1)
    assert "error" not in r, r.get("error")
    model, _, _ = load_run_model(run)
    merged = tmp_path / "merged"
    export_run(run, merged, "dreamzero")
    tensors = load_file(merged / "model.safetensors")
    ffn = model.blocks[1].ffn[0]
    assert isinstance(ffn, LoRALinear) and ffn.lora_B.weight.abs().sum() > 0
    want = ffn.base_layer.weight + (model.cfg.lora_alpha / model.cfg.lora_rank) * ffn.lora_B.weight @ ffn.lora_A.weight
    torch.testing.assert_close(tensors["action_head.model.blocks.1.ffn.0.weight"], want, rtol=0, atol=1e-7)

    adapters = tmp_path / "adapters"
    export_run(run, adapters, "peft")
    config = json.loads((adapters / "adapter_config.json").read_text())
    peft = load_file(adapters / "adapter_model.safetensors")
    assert config["r"] == 2 and "blocks.1.cross_attn.k" in config["target_modules"]
    assert sorted(config["modules_to_save"])[:2] == ["action_decoder.layer1", "action_decoder.layer2"]
    assert torch.equal(peft["base_model.model.blocks.1.ffn.0.lora_A.weight"], ffn.lora_A.weight)
    assert torch.equal(peft["base_model.model.action_encoder.W2.W"], model.action_encoder.W2.W)



def test_peft_loads_our_adapters_and_computes_our_output(tmp_path):
    """peft's own loader (PeftModel.from_pretrained) on the LoRA-free model holding the base checkpoint:
    its output is our LoRA model's (adapters and a fully trained module changed, so a wrong key,
    transpose, scale or a missing modules_to_save shows)."""
    peft_lib = pytest.importorskip("peft", reason="peft is an optional extra (pip install peft)")
    from test_dreamzero import tiny_batch
    from trainkit.weights.adapters import adapter_files, write_adapters

    torch.manual_seed(0)
    model = build_model("dreamzero", "tiny", {"lora_rank": 2, "lora_alpha": 3.0})
    start = {k: v.clone() for k, v in _plain(model).items()}  # the base checkpoint before "training"
    with torch.no_grad():
        for m in lora_layers(model).values():
            m.lora_B.weight.normal_(std=0.1)
        model.action_decoder.layer2.W.normal_(std=0.1)  # trained in full: peft's modules_to_save
    tensors, config = adapter_files(model, lambda path, part: path, "", torch.float32)
    write_adapters(tmp_path, tensors, config)
    base = build_model("dreamzero", "tiny")
    base.load_state_dict(start)
    batch = tiny_batch(model.cfg, 2)
    with torch.no_grad():
        without = base(batch)  # the positive control: the base alone is not our model
        wrapped = peft_lib.PeftModel.from_pretrained(base, str(tmp_path))
        ours, theirs = model(batch), wrapped(batch)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(without, ours, rtol=1e-5, atol=1e-6)


def _plain(model) -> dict[str, torch.Tensor]:
    """A LoRA model's base weights under the LoRA-free model's names (the adapters left out)."""
    return {k.replace(".base_layer.", "."): v for k, v in model.state_dict().items() if ".lora_" not in k}


def test_peft_export_of_a_run_without_adapters_is_refused(shards_rgb, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    [r] = run_distributed([tiny_config(shards_rgb, run, "train.steps=1", "output.checkpoint_every=1",
                                       "train.micro_batch=2")], world=1)
    assert "error" not in r, r.get("error")
    with pytest.raises(CheckpointError, match="trained no LoRA adapters"):
        export_run(run, tmp_path / "out", "peft")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["pi05", "dreamzero", "gr00t"])
def test_each_family_merges_and_names_its_adapters_in_its_checkpoint_layout(name):
    """Adapters randomised (B is zero at init): the family's export of the merged state holds
    base + (alpha / r) B_part A_part at each adapted module's rows, under the name the peft export
    gives that module (+ ".weight"); an unadapted part keeps the base."""
    from trainkit.models import family
    from trainkit.models.lora import merged_state, peft_tensors, without_lora

    torch.manual_seed(0)
    fam = family(name)
    model = build_model(name, "tiny", {"lora_rank": 2})
    with torch.no_grad():
        for m in lora_layers(model).values():
            m.lora_B.weight.normal_(std=0.1)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_" in n or (name == "dreamzero" and n.startswith(("state_", "action_"))) for n in trained)
    fmt = fam.weights.formats[0]
    extra = {"base": {}} if fam.weights.start_keys else {}
    tensors = fam.weights.export_tensors(without_lora(model.cfg), merged_state(model), fmt, **extra)
    names = fam.weights.peft_names or (lambda cfg, path, part: path)
    prefix = {"dreamzero": "action_head.model."}.get(name, "")
    adapters = peft_tensors(model, lambda path, part: names(model.cfg, path, part))
    checked = 0
    for path, m in lora_layers(model).items():
        for part, a, b, first, end in m.adapters():
            key = prefix + names(model.cfg, path, part) + ".weight"
            want = m.base_layer.weight[first:end] + m.scale * b @ a
            torch.testing.assert_close(tensors[key], want, rtol=0, atol=1e-6)
            assert torch.equal(adapters[f"base_model.model.{names(model.cfg, path, part)}.lora_A.weight"], a)
            checked += 1
    assert checked >= 4
