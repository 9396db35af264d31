"""rlforge's own log records come out as ``rlforge: warning: ...`` lines, like every other warning."""

from __future__ import annotations

import logging

from rlforge import cli


def test_rlforge_log_records_get_the_warning_prefix(capfd) -> None:
    cli._route_logs()
    cli._route_logs()  # idempotent: one handler, one line
    logging.getLogger("rlforge.rewards.manager").warning("sample %d failed", 3)
    logging.getLogger("rlforge.rewards.manager").info("not shown")
    err = capfd.readouterr().err
    assert err == "rlforge: warning: sample 3 failed\n"
