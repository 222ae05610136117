"""The `gr00t` model family: GR00T N1.7 (model.py): the frozen Qwen3-VL-2B backbone (qwen3_vl/),
optionally trained top LLM layers, and the flow-matching head with VL self-attention and
the DiT's alternating text/image cross-attention (action_head.py); shapes and presets (config.py),
checkpoints both ways (weights.py), what LeRobot serves an export with (lerobot_policy.py, readme.py),
analytic cost (flops.py), LoRA targets (lora.py), loader preset and batch adapter (batches.py), prompt tokenizer
(chat_tokenizer.py: the Qwen chat template), memory constants (memory.py), the head trained from a cached
backbone (cache.py: what a cached sample holds, its fingerprint, the batch adapter).
`FAMILY` is the record the trainer reaches it through (trainkit/models/family.py)."""
from trainkit.models.family import Family, Sampler, Weights
from trainkit.models.gr00t import lerobot_policy, readme, weights
from trainkit.models.gr00t.lerobot_shapes import lerobot_build
from trainkit.models.gr00t.batches import Gr00tBatches, loader_config
from trainkit.models.gr00t.cache import FROZEN_CACHE, Gr00tFeatureBatches
from trainkit.models.gr00t.config import PRESETS, Gr00tConfig
from trainkit.models.gr00t.flops import activations, flops_per_sample, tokens_per_sample
from trainkit.models.gr00t.lora import peft_names
from trainkit.models.gr00t.memory import MEMORY
from trainkit.models.gr00t.model import SAMPLE_STEPS, Gr00t, Gr00tBatch, flow_target, sample_actions, sample_flow

FAMILY = Family(name="gr00t", config=Gr00tConfig, presets=PRESETS, model=Gr00t, frozen=("vision_blocks", "lm_frozen"),
                flops_per_sample=flops_per_sample, tokens_per_sample=tokens_per_sample, activations=activations,
                max_slots=lambda cfg: cfg.max_slots, loader_config=loader_config, batches=Gr00tBatches,
                feature_batches=Gr00tFeatureBatches, frozen_cache=FROZEN_CACHE, memory=MEMORY, robot_dims={"state": "state_dim", "action": "action_dim"},
                weights=Weights(formats=weights.FORMATS, read_plan=weights.read_plan,
                                export_tensors=weights.export_tensors, config_json=weights.config_json,
                                config_from=weights.config_from_weights, start_keys=weights.start_keys,
                                lerobot_policy=lerobot_policy.lerobot_policy,
                                lerobot_processors=lerobot_policy.lerobot_processors, readme=readme.readme,
                                min_max_steps=(lerobot_policy.PACK_STEP, lerobot_policy.UNPACK_STEP),
                                tokenizer_step=(lerobot_policy.VLM_STEP, "model_name"), lerobot_shapes=lerobot_build,
                                peft_names=peft_names),
                sampler=Sampler(steps=SAMPLE_STEPS, noise_shapes=lambda cfg: ((cfg.horizon, cfg.action_dim),),
                                sample=lambda model, batch, noise, steps: sample_actions(model, batch, *noise, steps)))

__all__ = ["FAMILY", "PRESETS", "Gr00t", "Gr00tBatch", "Gr00tConfig", "flops_per_sample", "flow_target",
           "sample_actions", "sample_flow", "tokens_per_sample"]
