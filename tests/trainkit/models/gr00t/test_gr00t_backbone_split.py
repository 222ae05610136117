"""The `gr00t` model's backbone path (model.py `vl_features`: the ViT's blocks as a block list of the
root, the LLM split into frozen and trained layers, deepstack across the split) against the backbone
module tests/trainkit/models/gr00t/test_gr00t_backbone_oracle.py holds to LeRobot 0.6.1 (qwen3_vl/backbone.py `Qwen3VLBackbone`),
with the same weights mapped by the checkpoint rule (weights.py `backbone_name`): equal features at
every position, text padding included. A wrong split (the deepstack tokens added one layer early)
fails the same comparison.
"""
import torch

from test_gr00t import tiny_batch
from trainkit.models import build_model
from trainkit.models.gr00t.qwen3_vl.backbone import Qwen3VLBackbone
from trainkit.models.gr00t.weights import backbone_name


def test_vl_features_equal_the_backbone_module():
    torch.manual_seed(0)
    model = build_model("gr00t", "tiny")
    cfg = model.cfg
    backbone = Qwen3VLBackbone(cfg.backbone)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * 0.1)  # norms away from 1, biases away from 0
        theirs = dict(backbone.named_parameters())
        mapped = {backbone_name(n, cfg): p for n, p in model.named_parameters()
                  if n.startswith(("visual", "vision_blocks", "embed", "lm_"))}
        assert mapped.keys() == theirs.keys()
        for n, p in mapped.items():
            theirs[n].copy_(p)
    batch = tiny_batch(cfg)
    batch.image_mask[:] = True  # the module places every view (a missing camera is the model's own rule)
    ours, image_mask, valid, _ = model.vl_features(batch)
    input_ids, _, _ = model.vl_inputs(batch)
    out = backbone(input_ids, valid, batch.images.flatten(0, 1))
    assert torch.equal(out.image_mask, image_mask) and torch.equal(out.attention_mask, valid)
    torch.testing.assert_close(ours, out.features, rtol=1e-5, atol=1e-5)
    layers = model._layers  # the control: every deepstack addition one layer early
    model._layers = lambda blocks, first, *rest: layers(blocks, first - 1, *rest)
    assert not torch.allclose(model.vl_features(batch)[0], out.features, atol=1e-3)
