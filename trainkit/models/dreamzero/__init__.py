"""The `dreamzero` model family: a DreamZero-shaped world-action model (model.py: Wan-2.2-style DiT
with frozen stand-ins for the VAE and encoders), its teacher-forcing sequence (sequence.py) and
block-causal attention (attention.py), shapes and presets (config.py), analytic cost (flops.py),
loader preset and batch adapter (batches.py), memory constants with the GPU runs behind them
(memory.py); `FAMILY` is the record the trainer reaches it through."""
from trainkit.models.dreamzero.batches import DreamZeroBatches, DreamZeroFeatureBatches, loader_config
from trainkit.models.dreamzero.config import PRESETS, DreamZeroConfig
from trainkit.models.dreamzero.flops import activations, flops_per_sample, tokens_per_sample
from trainkit.models.dreamzero.memory import MEMORY
from trainkit.models.dreamzero.sequence import TokenSequence
from trainkit.models.dreamzero.model import SAMPLE_STEPS, DreamZero, DreamZeroBatch, sample_actions
from trainkit.models.family import Family, Sampler

FAMILY = Family(name="dreamzero", config=DreamZeroConfig, presets=PRESETS, model=DreamZero, frozen=DreamZero.FROZEN,
                flops_per_sample=flops_per_sample, tokens_per_sample=tokens_per_sample, activations=activations,
                max_slots=lambda cfg: 3, loader_config=loader_config, batches=DreamZeroBatches,
                feature_batches=DreamZeroFeatureBatches,
                memory=MEMORY, robot_dims={"state": "state_dim", "action": "action_dim"},
                sampler=Sampler(steps=SAMPLE_STEPS, noise_shapes=lambda cfg: (
                    (cfg.blocks * cfg.frames_per_block, cfg.tokens_per_frame, cfg.patch_channels),
                    (cfg.blocks, cfg.actions_per_block, cfg.action_dim)),
                    sample=lambda model, batch, noise, steps: sample_actions(model, batch, *noise, steps)))

__all__ = ["FAMILY", "PRESETS", "DreamZero", "DreamZeroBatch", "DreamZeroConfig", "TokenSequence", "flops_per_sample",
           "sample_actions", "tokens_per_sample"]
