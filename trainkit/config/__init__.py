"""The one training config (one room): the section dataclasses (sections.py), the `[data]` section
and a mixture's sources (data.py), the field checks every section runs (checks.py), and reading a
TOML file, an overlay and `--set` overrides into that tree (load.py).

    from trainkit.config import load_config, RunConfig
"""
from trainkit.config.data import DataConfig, SourceConfig, loader_sources, source_name
from trainkit.config.load import load_config
from trainkit.config.sections import (REQUIRED, ModelConfig, OptimConfig, OutputConfig, ParallelConfig, RunConfig,
                                      TrainConfig, config_from_dict)

__all__ = ["REQUIRED", "DataConfig", "ModelConfig", "OptimConfig", "OutputConfig", "ParallelConfig", "RunConfig",
           "SourceConfig", "TrainConfig", "config_from_dict", "load_config", "loader_sources", "source_name"]
