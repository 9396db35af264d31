"""The SFT command's arguments, torch-free (the CLI builds every parser at start-up)."""

from __future__ import annotations

import argparse


def add_sft_arguments(p: argparse.ArgumentParser) -> None:
    """``--config``, ``--print-config`` and the overrides (shared by ``rlforge sft`` and
    ``python -m rlforge.trainer.sft_trainer``)."""
    p.add_argument("--config", dest="config_file", default=None, help="YAML file of config values")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("overrides", nargs="*", help="key=value overrides with verl's SFT keys")
