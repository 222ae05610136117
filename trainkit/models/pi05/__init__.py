"""The `pi05` model family: a Pi0.5-shaped vision-language-action model (model.py), its shapes and
presets (config.py), its mixture-of-transformers layer (mot.py) and prompt tokenizer (tokenizer.py)."""
from trainkit.models.pi05.config import PRESETS, Pi05Config, flops_per_sample, tokens_per_sample
from trainkit.models.pi05.model import Pi05, Pi05Batch, sample_flow

__all__ = ["PRESETS", "Pi05", "Pi05Batch", "Pi05Config", "flops_per_sample", "sample_flow", "tokens_per_sample"]
