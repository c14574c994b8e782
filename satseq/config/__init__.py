"""The run configuration: schema (pydantic) and loading (YAML + overrides)."""

from satseq.config.load import (
    CONFIG_DIR,
    QUICKSTART,
    TRAIN_CONFIG,
    ConfigError,
    apply_override,
    dump_config,
    load_config,
    run_config_for,
)
from satseq.config.schema import RunConfig
from satseq.config.team import AgentConfig

__all__ = [
    "CONFIG_DIR",
    "QUICKSTART",
    "TRAIN_CONFIG",
    "AgentConfig",
    "ConfigError",
    "RunConfig",
    "apply_override",
    "dump_config",
    "load_config",
    "run_config_for",
]
