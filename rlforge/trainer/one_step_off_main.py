"""``python -m rlforge.trainer.one_step_off_main``: verl's one-step-off trainer's command line
(:mod:`rlforge.trainer.verl_split_mains`)."""

from __future__ import annotations

import sys

from rlforge.trainer.verl_split_mains import run_with_default_config


def main(argv: list[str] | None = None) -> int:
    return run_with_default_config(argv, "one_step_off_ppo_trainer")


if __name__ == "__main__":
    sys.exit(main())
