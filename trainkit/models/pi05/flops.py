"""The analytic cost of one `pi05` sample, as a function of the image slots its batch carries:
FLOPs (forward + backward), token counts, and the activations autograd saves (inspect's memory
estimate). `tests/trainkit/models/pi05/test_trainkit_model.py` checks the FLOPs against torch.utils.flop_counter.
With LoRA (`model.lora_rank`) the count is what runs (`lora_flops`), checked the same way in
tests/trainkit/models/test_lora_flops.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainkit.errors import ModelConfigError
from trainkit.models.family import Activations
from trainkit.models.pi05.config import Pi05Config


def tokens_per_sample(cfg: Pi05Config, n_slots: int) -> dict[str, int]:
    """Token counts of one sample with `n_slots` image slots present: vision (per image x slots),
    prefix (images + text), suffix (actions), total sequence through the MoT layers."""
    prefix = n_slots * cfg.tokens_per_image + cfg.text_len
    return {"vision": n_slots * cfg.tokens_per_image, "prefix": prefix, "suffix": cfg.horizon,
            "sequence": prefix + cfg.horizon}


def flops_per_sample(cfg: Pi05Config, n_slots: int) -> float:
    """Analytic model FLOPs of one sample, forward + backward (= 3 x forward: a matmul's backward is
    two matmuls), no recompute. Counts every matmul (2 FLOPs per multiply-add) and attention's
    QK^T and AV; not norms, activations, RoPE, softmax or the embedding lookup (no matmul).
    Follows the model exactly: the last MoT layer has no prefix queries/O/MLP (pi05.MoTLayer)."""
    if not 1 <= n_slots <= cfg.max_slots:
        raise ModelConfigError(f"n_slots {n_slots} is outside 1..max_slots={cfg.max_slots}")
    if cfg.lora_rank:
        return lora_flops(cfg, n_slots)
    t, d, a = cfg.tokens_per_image, cfg.vision_width, cfg.horizon
    per_image = (2 * t * 3 * cfg.patch ** 2 * d                                           # patchify conv
                 + cfg.vision_depth * (2 * t * (4 * d * d + 2 * d * cfg.vision_mlp) + 4 * t * t * d)
                 + 2 * t * d * cfg.lm_width)                                               # projector
    p = n_slots * t + cfg.text_len
    qd, kvd = cfg.heads_q * cfg.head_dim, 2 * cfg.heads_kv * cfg.head_dim
    lw, ew = cfg.lm_width, cfg.expert_width
    lm_full = 2 * p * (lw * (qd + kvd) + qd * lw + 3 * lw * cfg.lm_mlp) + 4 * p * p * qd
    lm_last = 2 * p * lw * kvd                                                             # K/V only
    expert = (2 * a * (ew * (qd + kvd) + qd * ew + 3 * ew * cfg.expert_mlp)
              + 4 * a * (p + a) * qd + 2 * ew * 6 * ew)                                    # + adaRMS linear
    heads = 2 * a * cfg.action_dim * ew * 2 + 2 * 2 * ew * ew + 2 * ew * 2 * ew            # act in/out, time MLP, final ada
    forward = n_slots * per_image + (cfg.lm_depth - 1) * lm_full + lm_last + cfg.lm_depth * expert + heads
    return 3.0 * forward


def _linear(tokens: int, i: int, o: int, grad_in: bool, r: int = 0, parts: tuple[int, ...] = ()) -> int:
    """A frozen linear's forward (and input gradient when its input needs one), plus rank-r adapters on
    output rows `parts` (one A stacked over them: forward, weight gradient, input gradient when
    needed; each B: forward, weight and input gradients)."""
    base = (1 + grad_in) * 2 * tokens * i * o
    if not parts:
        return base
    return base + (2 + grad_in) * 2 * tokens * i * r * len(parts) + 3 * 2 * tokens * r * sum(parts)


def lora_flops(cfg: Pi05Config, n_slots: int) -> float:
    """FLOPs of one sample's forward + backward with LoRA on `cfg.lora_targets`, everything else frozen:
    the vision tower, projector and backbone half see no gradient (forward only); the action expert
    and the action/time projections run forward and input gradients, weight gradients only in the
    adapters; a gradient flows only from the first adapted module on (the data needs none)."""
    t, d, a, r, tg = cfg.tokens_per_image, cfg.vision_width, cfg.horizon, cfg.lora_rank, set(cfg.lora_targets)
    p = n_slots * t + cfg.text_len
    qd, kv, ew, mlp = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim, cfg.expert_width, cfg.expert_mlp
    lw = cfg.lm_width
    frozen = (n_slots * (2 * t * 3 * cfg.patch ** 2 * d + cfg.vision_depth * (2 * t * (4 * d * d + 2 * d * cfg.vision_mlp)
                                                                               + 4 * t * t * d) + 2 * t * d * lw)
              + (cfg.lm_depth - 1) * (2 * p * (lw * (qd + 2 * kv) + qd * lw + 3 * lw * cfg.lm_mlp) + 4 * p * p * qd)
              + 2 * p * lw * 2 * kv)

    def lin(name: str, tokens: int, i: int, o: int, grad_in: bool) -> tuple[int, bool]:
        adapted = name in tg
        return _linear(tokens, i, o, grad_in, r, (o,) if adapted else ()), grad_in or adapted

    total, grad = 0, {}
    f, g = lin("time_mlp_in", 1, ew, ew, False)
    f2, cond = lin("time_mlp_out", 1, ew, ew, g)
    f3, xs = lin("action_in_proj", a, cfg.action_dim, ew, False)
    total += frozen + f + f2 + f3 + _linear(1, ew, 2 * ew, cond)  # final adaRMSNorm's linear
    for _ in range(cfg.lm_depth):
        total += _linear(1, ew, 6 * ew, cond)  # the expert's adaRMSNorm modulation
        h = xs or cond
        rows = {"q_proj": qd, "k_proj": kv, "v_proj": kv}
        total += _linear(a, ew, qd + 2 * kv, h, r, tuple(rows[n] for n in rows if n in tg))
        q = k = v = h or any(n in tg for n in rows)  # views of one output: any part adapted, all need a gradient
        unit = 2 * a * (p + a) * qd
        total += 2 * unit + unit * (q + k + (q or k) + v)
        attn = q or k or v
        f, y = lin("o_proj", a, qd, ew, attn)
        h2 = xs or y or cond
        gate_up = {"gate_proj": mlp, "up_proj": mlp}
        total += f + _linear(a, ew, 2 * mlp, h2, r, tuple(gate_up[n] for n in gate_up if n in tg))
        f, down = lin("down_proj", a, mlp, ew, h2 or any(n in tg for n in gate_up))
        total += f
        xs = h2 or down
    f, _ = lin("action_out_proj", a, ew, cfg.action_dim, xs or cond)
    return float(total + f)


def activations(cfg: Pi05Config, n_slots: int) -> Activations:
    """Saved-for-backward elements of ONE sample, eager: per block the set kept when it is not
    recomputed, and its input (all a recomputed block keeps). Per token of a SigLIP block: LN1
    input and output, q, k, v, attention output, LN2 input and output (8 x width) and the MLP's
    fc1 output and GELU output (2 x mlp). Per token of an MoT expert half: norm input and output,
    q, k, v, attention output, post-attention residual and its norm output, GeGLU's gate/up output
    (2 x mlp), GELU(gate) and the product (4 x mlp). The last layer's prefix half keeps only its
    norm input/output and k, v. Outside the blocks the patchify conv keeps its input images."""
    t, d = cfg.tokens_per_image, cfg.vision_width
    p, a = tokens_per_sample(cfg, n_slots)["prefix"], cfg.horizon
    qd, kv = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim

    def half(width: int, mlp: int) -> int:
        return 4 * width + 2 * qd + 2 * kv + 4 * mlp

    expert = a * half(cfg.expert_width, cfg.expert_mlp)
    vision = (n_slots * t * (8 * d + 2 * cfg.vision_mlp), n_slots * t * d)
    lm_input = p * cfg.lm_width + a * cfg.expert_width
    lm = [(p * half(cfg.lm_width, cfg.lm_mlp) + expert, lm_input)] * (cfg.lm_depth - 1)
    lm.append((p * (2 * cfg.lm_width + 2 * kv) + expert, lm_input))
    return Activations(blocks={"vision_blocks": [vision] * cfg.vision_depth, "lm_layers": lm},
                       root=n_slots * 3 * cfg.image_size ** 2)


def memory_terms(cfg: Pi05Config, n_slots: int, switches: Mapping[str, Any]) -> dict[str, dict[str, list[int]]]:
    """What the config switches change in the saved elements of ONE sample, per block (eager units;
    weighted by the fitted `MemoryCalibration.terms`, bench/results/memory.md):

    - "masked_attention" (`parallel.attention = "masked"`): the key-padding-masked SDPA keeps one
      query-sized tensor per call beyond the mask-free varlen kernel (models/varlen_attention.py),
      the prefix call's P x Hq x hd and the suffix call's A x Hq x hd; the last layer makes no prefix call.
    - "float8" (`parallel.float8_modules`): minus the inputs of the FP8 linears (tokens through each x
      its in_features), the bf16 copy a linear's backward keeps and a Float8Linear's compiled
      backward does not (in Pi0.5's GeGLU: the down projection's input, rebuilt from gate/up).
    - "lora" (`model.lora_rank`): the frozen vision tower and backbone half see no gradient, so
      autograd keeps nothing of them (minus their count, `activations`, but the backbone's K and V,
      which the action expert's attention keeps); each adapter keeps
      its rank-r hidden per token (lora_B's input) in the action expert.
    """
    p, a, t = tokens_per_sample(cfg, n_slots)["prefix"], cfg.horizon, n_slots * cfg.tokens_per_image
    qd = cfg.heads_q * cfg.head_dim
    out: dict[str, dict[str, list[int]]] = {}
    if switches.get("attention", "masked") == "masked":
        out["masked_attention"] = {"lm_layers": [p * qd + a * qd] * (cfg.lm_depth - 1) + [a * qd]}
    float8: Mapping[str, int] = switches.get("float8", {})
    if float8:
        rows = {"vision_blocks": [0] * cfg.vision_depth, "lm_layers": [0] * cfg.lm_depth}
        for name, fan_in in float8.items():
            parts = name.split(".")
            if parts[0] == "vision_blocks":
                rows["vision_blocks"][int(parts[1])] -= t * fan_in
            elif parts[0] == "lm_layers":
                rows["lm_layers"][int(parts[1])] -= (p if parts[2] == "lm" else a) * fan_in
            # a linear outside the blocks (projector, action heads) is left out: no run has one
        out["float8"] = rows
    if cfg.lora_rank:
        out["lora"] = lora_term(cfg, n_slots)
    return out


def lora_term(cfg: Pi05Config, n_slots: int) -> dict[str, list[int]]:
    """The "lora" memory term (`memory_terms`): per block, elements of one sample."""
    table = activations(cfg, n_slots)
    p, a = tokens_per_sample(cfg, n_slots)["prefix"], cfg.horizon
    kv, r = cfg.heads_kv * cfg.head_dim, cfg.lora_rank
    # the backbone half's count, but its K and V: the suffix queries' attention keeps them (concatenated)
    prefix = [p * (4 * cfg.lm_width + 2 * cfg.heads_q * cfg.head_dim + 4 * cfg.lm_mlp)] * (cfg.lm_depth - 1)
    prefix.append(p * 2 * cfg.lm_width)
    adapters = a * r * sum(n in cfg.lora_targets for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"))
    return {"vision_blocks": [-full for full, _ in table.blocks["vision_blocks"]],
            "lm_layers": [adapters - kept for kept in prefix]}
