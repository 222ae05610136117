"""`dreamzero` checkpoints and LoRA at tiny width (trainkit/models/dreamzero/weights.py, trainkit/models/lora.py):

- round trips: trainkit's tensors written in each format (DreamZero's whole-model save, sharded with
  an index, beside the text/image encoders and VAE it skips; Wan's original names; a diffusers
  WanTransformer3DModel folder) and read back by `model.init_from`'s loader give every parameter
  bit for bit; a Wan base DiT leaves the action/state MLPs at their init;
- a DreamZero LoRA checkpoint (peft's `base_model.model...{base_layer, lora_A.default, lora_B.default}`)
  is merged on load: W = base + (alpha / r) B @ A, written out here by hand;
- LoRA as a switch: only the adapters and the action/state MLPs train, the optimiser holds exactly
  those, and after AdamW steps the frozen base is bit-identical while the adapters moved;
- the shape is read from a checkpoint (`config_from_weights`).
"""
import json

import pytest
import torch
from safetensors.torch import save_file

from trainkit.models import build_model, family
from trainkit.models.dreamzero.weights import DZ, DZ_LORA, config_from_weights
from trainkit.weights.load import load_weights, read_weights_folder

FAM = family("dreamzero")


def randomised(overrides=None, seed=0):
    torch.manual_seed(seed)
    model = build_model("dreamzero", "tiny", overrides or {})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def write(folder, tensors, config, shards=1):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    keys = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k].contiguous() for k in keys}, str(folder / "model.safetensors"))
        return folder
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[i::shards]
        save_file({k: tensors[k].contiguous() for k in part}, str(folder / name))
        weight_map.update({k: name for k in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("fmt", ["dreamzero", "wan", "diffusers"])
def test_round_trip_through_each_format(tmp_path, fmt):
    src = randomised()
    tensors = FAM.weights.export_tensors(src.cfg, src.state_dict(), fmt)
    if fmt == "dreamzero":  # the whole-model save: encoders and VAE beside the DiT, sharded
        tensors.update({"action_head.text_encoder.w": torch.ones(3), "action_head.vae.w": torch.ones(2)})
    if fmt == "diffusers":
        (tmp_path / "ckpt").mkdir()
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps({"num_attention_heads": src.cfg.heads}))
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "ckpt" / "diffusion_pytorch_model.safetensors"))
        folder = tmp_path / "ckpt"
    else:
        folder = write(tmp_path / "ckpt", tensors, FAM.weights.config_json(src.cfg, {}), 3 if fmt == "dreamzero" else 1)
    dst = randomised(seed=1)
    said = []
    info = load_weights(dst, FAM, folder, said.append)
    assert info["layout"] == fmt
    robot = ("state_encoder", "action_encoder", "action_decoder")
    for (name, a), b in zip(src.named_parameters(), dst.parameters()):
        if fmt != "dreamzero" and name.startswith(robot):  # not in a Wan DiT: kept at dst's init
            assert not torch.equal(a, b), name
        else:
            assert torch.equal(a, b), name
    assert (info["kept_at_init"] > 0) == (fmt != "dreamzero") and (info["unused_keys"] == 2) == (fmt == "dreamzero")
    fixed = config_from_weights(read_weights_folder(folder), src.cfg, {})
    assert {k: v for k, (v, _) in fixed.items() if k in ("dim", "depth", "ffn", "heads", "latent_channels")} == \
        {"dim": 32, "depth": 2, "ffn": 64, "heads": 2, "latent_channels": 8}


def test_a_lora_checkpoint_is_merged_on_load(tmp_path):
    """peft's layout, written by hand: every q/k/v/o/ffn.0/ffn.2 as base_layer + lora_A/B.default."""
    src = randomised()
    cfg, alpha, rank = src.cfg, 4.0, 3
    g = torch.Generator().manual_seed(5)
    tensors, want = {}, {}
    for name, p in src.state_dict().items():
        stem, _, kind = name.rpartition(".")
        adapted = stem.endswith((".q", ".k", ".v", ".o", "ffn.0", "ffn.2")) and stem.startswith("blocks.")
        if not adapted:
            tensors[DZ_LORA + name] = p  # not adapted: the plain name under peft's wrapper
            want[name] = p
            continue
        tensors[f"{DZ_LORA}{stem}.base_layer.{kind}"] = p
        want[name] = p
        if kind == "weight":
            a, b = torch.randn(rank, p.shape[1], generator=g), torch.randn(p.shape[0], rank, generator=g)
            tensors[f"{DZ_LORA}{stem}.lora_A.default.weight"] = a
            tensors[f"{DZ_LORA}{stem}.lora_B.default.weight"] = b
            want[name] = p + (alpha / rank) * b @ a
    folder = write(tmp_path / "lora", tensors, {"num_heads": cfg.heads})
    dst = randomised(seed=2)
    load_weights(dst, FAM, folder, lambda s: None)
    for name, p in dst.named_parameters():
        torch.testing.assert_close(p, want[name], rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert not torch.equal(dst.blocks[0].self_attn.q.weight, src.blocks[0].self_attn.q.weight)  # merged, not copied
    # into a model with LoRA on: the merged weights become its frozen base, its adapters stay fresh
    lora = randomised({"lora_rank": 2}, seed=3)
    fresh = lora.blocks[1].cross_attn.v.lora_B.weight.clone()
    load_weights(lora, FAM, folder, lambda s: None)
    torch.testing.assert_close(lora.blocks[1].cross_attn.v.base_layer.weight, want["blocks.1.cross_attn.v.weight"],
                               rtol=1e-6, atol=1e-6)
    assert torch.equal(lora.blocks[1].cross_attn.v.lora_B.weight, fresh)
    assert DZ + "blocks.0.self_attn.q.weight" not in tensors


def test_lora_trains_only_adapters_and_the_robot_mlps():
    from trainkit.config import OptimConfig
    from trainkit.optim.optimizer import build_optimizer
    from test_dreamzero import tiny_batch

    torch.manual_seed(0)
    model = build_model("dreamzero", "tiny", {"lora_rank": 2})
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    adapters = {n for n in trainable if ".lora_" in n}
    assert adapters and len(adapters) == 2 * 2 * (4 + 4 + 2)  # 2 blocks x (self q,k,v,o; cross q,k,v,o; ffn.0, ffn.2) x A,B
    assert trainable - adapters == {n for n, _ in model.named_parameters()
                                    if n.startswith(("state_encoder", "action_encoder", "action_decoder"))}
    opt = build_optimizer(model, OptimConfig(lr=1e-2, fused=False), torch.device("cpu"))
    assert {id(p) for group in opt.param_groups for p in group["params"]} == \
        {id(p) for n, p in model.named_parameters() if n in trainable}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = tiny_batch(model.cfg, 2)
    for _ in range(2):
        opt.zero_grad()
        model(batch).backward()
        opt.step()
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]) == (n not in trainable), n
    # export merges the adapters: base + (alpha / r) B @ A
    out = FAM.weights.export_tensors(model.cfg, model.state_dict(), "dreamzero")
    q = model.blocks[1].cross_attn.q
    want = q.base_layer.weight + (model.cfg.lora_alpha / 2) * q.lora_B.weight @ q.lora_A.weight
    torch.testing.assert_close(out[DZ + "blocks.1.cross_attn.q.weight"], want, rtol=0, atol=1e-6)
