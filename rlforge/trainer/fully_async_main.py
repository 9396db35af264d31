"""``python -m rlforge.trainer.fully_async_main``: verl's fully-async trainer's command line
(:mod:`rlforge.trainer.verl_split_mains`)."""

from __future__ import annotations

import sys

from rlforge.trainer.verl_split_mains import run_with_default_config


def main(argv: list[str] | None = None) -> int:
    return run_with_default_config(argv, "fully_async_ppo_trainer")


if __name__ == "__main__":
    sys.exit(main())
