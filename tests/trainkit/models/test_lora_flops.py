"""MFU counts what runs under LoRA (trainkit/models/dreamzero/flops.py `lora_flops`, pi05/flops.py):
the analytic FLOPs of one LoRA sample's forward + backward equal torch.utils.flop_counter's count of
a tiny step exactly (the frozen base's forward and input gradients, the adapters' forward and both
gradients, no weight gradient of a frozen weight), and are below the full model's 3x count. Inputs
do not require grad, as in a real step (the data never does)."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from trainkit.models import build_model, family


def counted(model, batch) -> int:
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(batch).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("targets", [("q", "k", "v", "o", "ffn.0", "ffn.2"), ("q", "v")])
def test_dreamzero_lora_flops_match_the_counter(targets):
    from test_dreamzero import tiny_batch

    torch.manual_seed(0)
    model = build_model("dreamzero", "tiny", {"lora_rank": 2, "lora_targets": targets})
    cfg, b = model.cfg, 2
    fam = family("dreamzero")
    assert counted(model, tiny_batch(cfg, b)) == b * fam.flops_per_sample(cfg, 3)
    full = build_model("dreamzero", "tiny").cfg
    assert fam.flops_per_sample(cfg, 3) < fam.flops_per_sample(full, 3)


@pytest.mark.parametrize("targets", [("q_proj", "v_proj", "action_in_proj", "action_out_proj"),
                                     ("k_proj", "o_proj", "up_proj", "down_proj", "time_mlp_out")])
def test_pi05_lora_flops_match_the_counter(targets):
    from test_trainkit_model import make_batch

    torch.manual_seed(0)
    model = build_model("pi05", "tiny", {"lora_rank": 2, "lora_targets": targets})
    cfg, b = model.cfg, 2
    fam = family("pi05")
    assert counted(model, make_batch(cfg, b=b, slots=3, text_valid=30)) == b * fam.flops_per_sample(cfg, 3)
    assert fam.flops_per_sample(cfg, 3) < fam.flops_per_sample(build_model("pi05", "tiny").cfg, 3)


@pytest.mark.parametrize("targets", [("to_q", "to_v"), ("to_k", "to_out")])
def test_gr00t_lora_flops_match_the_counter(targets):
    from test_gr00t import tiny_batch

    torch.manual_seed(0)
    model = build_model("gr00t", "tiny", {"lora_rank": 2, "lora_targets": targets})
    batch = tiny_batch(model.cfg, b=3, slots=2)
    batch.image_mask[:] = True
    fam = family("gr00t")
    assert counted(model, batch) == 3 * fam.flops_per_sample(model.cfg, 2)
    assert fam.flops_per_sample(model.cfg, 2) < fam.flops_per_sample(build_model("gr00t", "tiny").cfg, 2)
