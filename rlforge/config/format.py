"""Render a config as resolved YAML (``rlforge train --print-config``)."""

from __future__ import annotations

from omegaconf import OmegaConf

from rlforge.config.root import RLForgeConfig


def format_config(cfg: RLForgeConfig) -> str:
    """Resolved YAML of ``cfg``; feeding it back as ``--config`` yields an equal config."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)
