"""verl-compatible entry point: ``python -m rlforge.trainer.main_ppo key=value ...``.

Takes the same command line as ``python -m verl.trainer.main_ppo``: the config starts
from verl's defaults (no embedded job), then applies the overrides.  Hydra's ``--config-path DIR
--config-name NAME`` (verl's ``--config-path=config --config-name=ppo_megatron_trainer`` is built in),
``--config FILE``, ``--print-config`` and ``--verbose`` (other libraries' warnings too) work as for
``rlforge train``.
"""

from __future__ import annotations

import sys

from rlforge.cli import main as cli_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return cli_main(["train", "--job", "none", *argv])


if __name__ == "__main__":
    sys.exit(main())
