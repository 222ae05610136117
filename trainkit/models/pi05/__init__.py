"""The `pi05` model family: a Pi0.5-shaped vision-language-action model (model.py) with its
mixture-of-transformers layer (mot.py), shapes and presets (config.py), analytic cost (flops.py),
loader preset and batch adapter (batches.py), prompt tokenizer (tokenizer.py), LoRA targets (lora.py), memory
constants with the GPU runs behind them (memory.py), the mapping to LeRobot's and openpi's checkpoints
(weights.py) and the README an export carries (readme.py); `FAMILY` is the record the trainer
reaches it through (trainkit/models/family.py)."""
from trainkit.models.family import Family, Sampler, Weights
from trainkit.models.pi05 import readme, weights
from trainkit.models.pi05.lerobot_shapes import lerobot_build
from trainkit.models.pi05.lora import peft_names
from trainkit.models.pi05.batches import Pi05Batches, loader_config
from trainkit.models.pi05.config import PRESETS, Pi05Config
from trainkit.models.pi05.flops import activations, flops_per_sample, memory_terms, tokens_per_sample
from trainkit.models.pi05.memory import MEMORY
from trainkit.models.pi05.model import SAMPLE_STEPS, Pi05, Pi05Batch, sample_actions, sample_flow

FAMILY = Family(name="pi05", config=Pi05Config, presets=PRESETS, model=Pi05, flops_per_sample=flops_per_sample,
                tokens_per_sample=tokens_per_sample, activations=activations, memory_terms=memory_terms,
                max_slots=lambda cfg: cfg.max_slots,
                loader_config=loader_config, batches=Pi05Batches, memory=MEMORY,
                weights=Weights(formats=weights.FORMATS, read_plan=weights.read_plan,
                                export_tensors=weights.export_tensors, config_json=weights.policy_config,
                                config_from=weights.config_from_weights, metadata=weights.shape_metadata,
                                lerobot_processors=weights.lerobot_processors, readme=readme.readme,
                                lerobot_shapes=lerobot_build, peft_names=peft_names),
                robot_dims={"state": "max_state_dim", "action": "action_dim"},
                sampler=Sampler(steps=SAMPLE_STEPS, noise_shapes=lambda cfg: ((cfg.horizon, cfg.action_dim),),
                                sample=lambda model, batch, noise, steps: sample_actions(model, batch, *noise, steps)))

__all__ = ["FAMILY", "PRESETS", "Pi05", "Pi05Batch", "Pi05Config", "flops_per_sample", "sample_actions", "sample_flow",
           "tokens_per_sample"]
