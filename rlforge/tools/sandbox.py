"""Sandboxes for model-written code: ``bwrap`` (bubblewrap), ``nsjail``, ``remote`` (a SandboxFusion endpoint).

:func:`select_sandbox` picks one from a tool's ``config`` (see docs/sandbox.md):

* ``sandbox_fusion_url`` set: ``remote`` (:mod:`.sandbox_remote`, verl's SandboxFusion HTTP form);
* else ``sandbox: auto`` [default]: ``bwrap`` where it is installed and works, else ``nsjail``;
  ``sandbox: bwrap | nsjail | remote`` asks for one;
* none usable: :class:`SandboxUnavailable` naming what to install, unless ``allow_unsandboxed: true``,
  which warns and runs the code in a plain limited subprocess (:mod:`.sandbox_unsafe`), NOT a sandbox.

The local sandboxes run ``python -I`` with new PID, network, IPC, UTS, mount and user namespaces (as uid
65534, no capabilities), a read-only view of the system and the interpreter's prefix only, a private
size-limited tmpfs as ``/tmp`` (working directory and ``HOME``), their own ``/proc``, a cleared environment,
and rlimits set before the user's code runs (processes, address space, CPU seconds, file size).  The code
arrives on stdin, so no host path is mounted.  At the wall limit the whole process tree dies: the
bwrap/nsjail process group is killed and the PID namespace dies with its init.
"""

from __future__ import annotations

import warnings
from typing import Any

from rlforge.errors import RLForgeWarning
from rlforge.tools import sandbox_local as _local  # noqa: F401  (registers bwrap, nsjail)
from rlforge.tools import sandbox_remote as _remote  # noqa: F401  (registers remote)
from rlforge.tools.sandbox_base import (
    INSTALL_HINT,
    RISK_KEY,
    SANDBOXES,
    Limits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
)
from rlforge.tools.sandbox_unsafe import UnsandboxedSubprocess

__all__ = ["Limits", "RunResult", "Sandbox", "SandboxUnavailable", "RISK_KEY", "select_sandbox"]


def select_sandbox(config: dict[str, Any], tool: str = "python_executor") -> Sandbox:
    """The sandbox the tool ``config`` asks for (module docstring).

    Raises:
        SandboxUnavailable: none usable and ``allow_unsandboxed`` is not true; the message names
            ``apt-get install bubblewrap``, ``sandbox_fusion_url`` and ``allow_unsandboxed: true``.
        ValueError: ``sandbox`` names no backend, or ``remote`` without ``sandbox_fusion_url``.
    """
    choice = str(config.get("sandbox", "auto"))
    if config.get("sandbox_fusion_url") and choice == "auto":
        choice = "remote"
    if config.get("sandbox_fusion_url") and choice != "remote":  # the URL would be silently unused
        raise ValueError(f"sandbox={choice!r} with sandbox_fusion_url={config['sandbox_fusion_url']!r}: the URL is "
                         "only used by the remote sandbox; drop one of them (or set sandbox: remote)")
    if choice != "auto" and choice not in SANDBOXES:
        raise ValueError(f"sandbox={choice!r}: unknown; one of auto, {', '.join(SANDBOXES.names())}")
    reasons = []
    for name in ["bwrap", "nsjail"] if choice == "auto" else [choice]:
        try:
            return SANDBOXES.get(name)(config)
        except SandboxUnavailable as e:
            if choice != "auto":
                hint = f"`{INSTALL_HINT}`" if name == "bwrap" else f"`{name}` on PATH"
                raise SandboxUnavailable(f"{tool}: sandbox: {choice} in the tool's config, but {e}; install {hint}, "
                                         f"or set sandbox: auto (or sandbox_fusion_url), or `{RISK_KEY}: true` with "
                                         "sandbox: auto to accept the risk (see docs/sandbox.md)") from None
            reasons.append(f"{name}: {e}")
    if config.get(RISK_KEY) is True:
        warnings.warn(f"{tool}: {RISK_KEY}: true and no sandbox here ({'; '.join(reasons)}): model-written code "
                      "runs UNSANDBOXED, with the trainer's user, files and processes in reach", RLForgeWarning,
                      stacklevel=2)
        return UnsandboxedSubprocess()
    raise SandboxUnavailable(
        f"{tool} will not run model-written code without a sandbox, and none is usable here ({'; '.join(reasons)}). "
        f"Install bubblewrap (`{INSTALL_HINT}`), or set sandbox_fusion_url in the tool's config to a SandboxFusion "
        f"endpoint, or set `{RISK_KEY}: true` in the tool's config to accept the risk (see docs/sandbox.md)")
