"""Entry points named after verl's experimental split trainers, for their scripts with the module swapped:

    python -m rlforge.trainer.fully_async_main ...   # for verl.experimental.fully_async_policy.fully_async_main
    python -m rlforge.trainer.one_step_off_main ...  # for verl.experimental.one_step_off_policy.main_ppo

Each is ``python -m rlforge.trainer.main_ppo`` with verl's default ``--config-name`` of that trainer
(``fully_async_ppo_trainer`` / ``one_step_off_ppo_trainer``, rlforge's copies in ``rlforge/config/verl_files``)
where the command line names none.  rlforge trains colocated on every GPU: the split trainer's own keys warn
(``rlforge/config/verl_keys.py``), ``async_training.partial_rollout`` is rlforge's partial rollout.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rlforge.cli import main as cli_main

_NAME_FLAGS = ("--config-name", "-cn")


def run_with_default_config(argv: Sequence[str] | None, config_name: str) -> int:
    """``rlforge train --job none`` with ``--config-name config_name`` unless ``argv`` names one."""
    args = list(sys.argv[1:] if argv is None else argv)
    named = any(a in _NAME_FLAGS or a.startswith(tuple(f + "=" for f in _NAME_FLAGS)) for a in args)
    return cli_main(["train", "--job", "none", *([] if named else ["--config-name", config_name]), *args])
