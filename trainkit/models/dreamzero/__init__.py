"""The `dreamzero` model family: DreamZero, a Wan DiT with action and state tokens (model.py), its
teacher-forcing sequence (sequence.py), block-causal attention (attention.py), RoPE (rope.py), flow
schedule (schedule.py), checkpoint formats (weights.py), shapes and presets (config.py), analytic cost (flops.py),
loader preset and batch adapter (batches.py, with the frame path's stand-in features: standin.py),
memory constants with the GPU runs behind them (memory.py); `FAMILY` is the record the trainer
reaches it through."""
from trainkit.models.dreamzero.batches import DreamZeroBatches, DreamZeroFeatureBatches, loader_config
from trainkit.models.dreamzero.config import PRESETS, DreamZeroConfig
from trainkit.models.dreamzero.flops import activations, flops_per_sample, memory_terms, tokens_per_sample
from trainkit.models.dreamzero.memory import MEMORY
from trainkit.models.dreamzero.sequence import TokenSequence
from trainkit.models.dreamzero.model import SAMPLE_STEPS, DreamZero, DreamZeroBatch, sample_actions
from trainkit.models.dreamzero.weights import FORMATS, config_from_weights, config_json, export_tensors, read_plan
from trainkit.models.family import Family, Sampler, Weights

FAMILY = Family(name="dreamzero", config=DreamZeroConfig, presets=PRESETS, model=DreamZero, frozen=DreamZero.FROZEN,
                flops_per_sample=flops_per_sample, tokens_per_sample=tokens_per_sample, activations=activations,
                memory_terms=memory_terms,
                max_slots=lambda cfg: 3, loader_config=loader_config, batches=DreamZeroBatches,
                feature_batches=DreamZeroFeatureBatches,
                memory=MEMORY, weights=Weights(formats=FORMATS, read_plan=read_plan, export_tensors=export_tensors,
                                               config_json=config_json, config_from=config_from_weights),
                robot_dims={"state": "state_dim", "action": "action_dim"},
                sampler=Sampler(steps=SAMPLE_STEPS, noise_shapes=lambda cfg: (
                    (cfg.latent_channels, cfg.latent_frames, *cfg.latent_hw), (cfg.horizon, cfg.action_dim)),
                    sample=lambda model, batch, noise, steps: sample_actions(model, batch, *noise, steps)))

__all__ = ["FAMILY", "PRESETS", "DreamZero", "DreamZeroBatch", "DreamZeroConfig", "TokenSequence", "flops_per_sample",
           "sample_actions", "tokens_per_sample"]
